"""A lean forward for Llama-family models on the CPU, in the style of gpt-fast's ``model.py``.

Why not transformers' forward: with 4-bit weights a decode step's matmuls take a few ms, and
transformers' eager forward spent about twice that again on small ops (per-layer cache objects,
masks built per layer, rotary tables per pass, dtype shuffles, ``torch.cat`` of the cache). Here
a step is the minimum: per layer one norm, one product for q/k/v together, one complex multiply
for rotary on q and k (v multiplied by 1), one copy of k and v into a preallocated cache, the
attention products (one per 256 keys), one product for the output, one norm, one product for
gate and up together, one for down.

Every row of a pass is computed as it would be alone (the tests check it bit for bit): the
linear layers are batch-invariant (``quant/layers.py``), attention multiplies at least as many
query rows at a time as ``attention_row_floor`` finds this CPU needs (MKL sums a product of few
rows in another order: up to 2 rows on one CPU, 3 on an AVX-512 one), reads keys in whole blocks
of ``KEY_BLOCK`` and sums them block by block in order (MKL splits one long sum by its length),
and the causal mask only adds exact zeros to a row's sums. That is what makes speculative greedy
decoding equal plain decoding of this very model, and a cache filled by any mix of prefills,
steps and verify passes equal to one filled in one pass.

Only the pass is here. Which families it runs is ``architectures.py``'s table, a model's shape
``shapes.py``; the weights come from a GGUF file's own quantized blocks (``gguf_loader.py``) or
from a transformers model quantized at load (``transformers_loader.py``), both put together into
a ``LlamaForward`` by ``assembly.py``. Rotary embeddings act on adjacent pairs, as in llama.cpp's
layout; the loaders permute rows kept in rotate-half order into it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gguf import quants

from speculative_complete.decoding.forward.native.layers import NativeLayers
from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.native.linear import NativeLinear
from speculative_complete.decoding.forward.quant.layers import DenseOutputLayer
from speculative_complete.decoding.forward.shapes import LlamaShape
from speculative_complete.decoding.memory import TRIM_ROWS, trim_heap, untouched_zeros

log = logging.getLogger(__name__)

# Attention's few-row products are padded to at most this many rows (``attention_row_floor``
# finds how many this CPU needs); where the probe finds no floor, this is used and logged.
MAX_ATTENTION_ROWS = 16
# Row counts the probe compares with one longer reference pass: every count that may be padded,
# and longer passes (a verify pass, a prefill chunk).
PROBE_ROWS = (*range(1, MAX_ATTENTION_ROWS + 1), 24, 32, 64, 128)
PROBE_REFERENCE_ROWS = 256
# Attention sums over keys in blocks of this many, in order: MKL splits a longer sum in ways that
# depend on its length, so a row would not add up the same in a pass that attends to more keys.
KEY_BLOCK = 256
# Relative cost of a pass over n tokens (one token = 1.0), measured for SmolLM2-135M on its Q4_1
# GGUF on the 2-core CPU (``benchmarks/pass_bench.py``): the 4-bit kernel dequantizes its weights
# once per four rows, so cost climbs in steps of four. The engine's cost model starts from this and
# replaces it with live timings; the long passes price drafts that ride on a prefill.
COST_PRIOR = {
    1: 1.0,
    2: 1.11,
    3: 1.26,
    4: 1.37,
    5: 2.0,
    6: 2.0,
    8: 2.16,
    9: 2.85,
    12: 2.98,
    16: 3.79,
    24: 5.29,
    32: 7.07,
    64: 9.36,
    128: 16.35,
    256: 30.7,
    512: 69.8,
}


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor
    qkv: torch.nn.Module
    out: torch.nn.Module
    ffn_norm: torch.Tensor
    gate_up: torch.nn.Module
    down: torch.nn.Module
    qkv_bias: torch.Tensor | None = None  # fp32, q, k and v's biases in order (Qwen2)
    q_norm: torch.Tensor | None = None  # fp32 (head_dim,): RMS norms of each query and key head
    k_norm: torch.Tensor | None = None  # before rotary (Qwen3)


Embedding = Callable[[torch.Tensor], torch.Tensor]  # token ids -> (rows, dim) fp32


class DenseEmbedding:
    """An fp32 embedding table (also the tied dense output layer's weights)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


class BlockEmbedding:
    """An embedding table looked up in a GGUF's own blocks (memory-mapped): each lookup
    dequantizes just its rows, exactly as the gguf package does, so a large untied table takes
    no fp32 copy (Qwen2.5-Coder-7B's would be 2.2 GB)."""

    def __init__(self, blocks: np.ndarray, kind: Any, width: int) -> None:
        self.blocks, self.kind, self.width = blocks, kind, width  # blocks: (rows, bytes per row)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.blocks[ids.reshape(-1).cpu().numpy()]
        values = quants.dequantize(rows, self.kind).astype(np.float32).reshape(*ids.shape, self.width)
        return torch.from_numpy(values)


class KVCache:
    """Keys and values of every layer in one preallocated buffer; cropping moves an index.

    ``crop`` and ``get_seq_length`` follow transformers' ``DynamicCache`` so the engine and the
    prefix store treat both alike. The buffer grows by a quarter (at least ``SPARE`` tokens)
    when a pass would overflow it; positions past ``length`` hold stale but finite values,
    which the causal mask hides. A layer's keys and values are adjacent heads of one tensor
    (``layer(i)``: keys first), as the projection leaves them, so a pass stores both in one copy.
    Both buffers are ``untouched_zeros``: their headroom (up to a third of a cache just grown)
    takes no memory until positions reach it.
    """

    SPARE = 256

    def __init__(self, shape: LlamaShape, capacity: int = 0) -> None:
        self.shape = shape
        self.length = 0
        self.kv = self._buffer(max(capacity, self.SPARE))
        self._layers = list(self.kv)  # each layer's view, made once: not a select per layer per pass
        # The last layer's output after the final norm at every position: what a draft head
        # (``speculative_complete/decoding/draft_head/network.py``) reads. 1/40 of the keys' and values' size.
        self.hidden = untouched_zeros(self.capacity, shape.dim)

    def _buffer(self, capacity: int) -> torch.Tensor:
        s = self.shape
        return untouched_zeros(s.layers, 2 * s.kv_heads, capacity, s.head_dim)

    @property
    def capacity(self) -> int:
        return self.kv.shape[2]

    def layer(self, index: int) -> torch.Tensor:
        """Layer ``index``'s keys then values, (2 * kv_heads, capacity, head_dim)."""
        return self._layers[index]

    @property
    def keys(self) -> torch.Tensor:
        return self.kv[:, : self.shape.kv_heads]

    @property
    def values(self) -> torch.Tensor:
        return self.kv[:, self.shape.kv_heads :]

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more tokens, in whole key blocks (attention reads whole blocks)."""
        need = -(-(self.length + extra) // KEY_BLOCK) * KEY_BLOCK
        if need <= self.capacity:
            return
        capacity = need + max(self.SPARE, need // 4 // KEY_BLOCK * KEY_BLOCK)
        grown = self._buffer(capacity)
        grown[:, :, : self.length] = self.kv[:, :, : self.length]
        self.kv, self._layers = grown, list(grown)
        hidden = untouched_zeros(capacity, self.shape.dim)
        hidden[: self.length] = self.hidden[: self.length]
        self.hidden = hidden

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        """``n`` < 0 drops that many tokens from the end; otherwise keeps the first ``n``."""
        self.length = max(0, self.length + n) if n < 0 else min(self.length, n)

    def nbytes(self) -> int:
        return self.kv.nbytes + self.hidden.nbytes


ROTARY_CHUNK = 4096  # positions the lean forward's rotary table grows by


def rotary_table(shape: LlamaShape, first: int = 0, last: int | None = None) -> torch.Tensor:
    """(positions ``first`` to ``last``, head_dim / 2) complex64: each position's rotation of each
    adjacent pair (to the model's context by default)."""
    half = shape.head_dim // 2
    freqs = shape.rope_theta ** (-torch.arange(0, half, dtype=torch.float64) / half)
    end = shape.max_context if last is None else last
    positions = torch.arange(first, end, dtype=torch.float64) / shape.rope_scale
    angles = torch.outer(positions, freqs)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def head_scales(shape: LlamaShape) -> torch.Tensor:
    """(heads + kv_heads, 1): q's rows also take the attention scale (applied with the rotation),
    k's rows do not."""
    return torch.tensor([shape.head_dim**-0.5] * shape.heads + [1.0] * shape.kv_heads)[:, None]


def fingerprint(layers: int, dim: int, vocab: int, norm: torch.Tensor, output_rows: Embedding) -> str:
    """The shape and a digest of the final norm and the first output rows, fp32 on the host."""
    digest = hashlib.sha256(norm.detach().float().cpu().numpy().tobytes())
    first = output_rows(torch.arange(min(16, vocab)))
    digest.update(first.detach().float().cpu().numpy().tobytes())
    return f"{layers}x{dim}x{vocab}:{digest.hexdigest()[:16]}"


class LlamaForward:
    """Logits for tokens fed after a ``KVCache``; the model's weights and rotary table."""

    def __init__(
        self,
        shape: LlamaShape,
        embed: Embedding,
        layers: list[LlamaLayer],
        norm: torch.Tensor,
        output_layer: torch.nn.Module,
        native: Kernels | None = None,
    ) -> None:
        self.shape, self.embed, self.layers, self.norm = shape, embed, layers, norm
        self.output_layer = output_layer
        self.formats = ""  # where the weights came from, for logs and stats (e.g. "F32+Q4_1+Q8_0")
        self.cost_prior = dict(COST_PRIOR)
        self.max_context: int | None = None  # its cache grows: the model's context is the limit
        half = shape.head_dim // 2
        # Grown with the positions a pass reaches (a 32k-position table is 16 MB), a whole
        # ``ROTARY_CHUNK`` at a time: every element is computed alike in any chunk, so a
        # position's rotation does not depend on when the table grew.
        self.rotary = rotary_table(shape, 0, min(ROTARY_CHUNK, shape.max_context))
        self.head_scale = head_scales(shape)
        # v's rows are not rotated: they are multiplied by exactly 1 + 0i, which leaves them as
        # they are, so q, k and v come out of one multiply.
        self.unrotated = torch.ones(1, shape.kv_heads, half, dtype=torch.complex64)
        # Attention on the native kernels where the products run there (one call a layer, each row
        # on its own); else torch's products, padded to the rows this CPU needs
        # (``attention_row_floor``).
        self.native = native
        # All layers in one native call where they allow it (``NativeLayers.covers``).
        covered = native is not None and NativeLayers.covers(layers)
        self.native_layers = NativeLayers(native, layers, shape) if covered else None
        self.min_attention_rows = 1 if self.native else attention_row_floor(shape.kv_heads, shape.head_dim)

    @property
    def vocab_size(self) -> int:
        return self.shape.vocab

    def new_cache(self) -> KVCache:
        return KVCache(self.shape)

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the output layer, fp32 (a quantized layer's dequantized)."""
        return self.output_layer.rows(ids)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Which target a draft head was trained for: the shape and a digest of the final norm
        and the first output rows (a graphed forward carries its lean forward's)."""
        s = self.shape
        return fingerprint(s.layers, s.dim, s.vocab, self.norm, self.output_rows)

    @property
    def embedding_table(self) -> torch.Tensor | None:
        """The fp32 embedding table where it is kept dense; None where rows are looked up in the
        GGUF's blocks or in the quantized output layer."""
        return self.embed.table if isinstance(self.embed, DenseEmbedding) else None

    def nbytes(self) -> int:
        """Bytes of weights (the tied embedding counted once)."""
        total = self.norm.nbytes + self.output_layer.nbytes()
        table = self.embedding_table
        tied = isinstance(self.output_layer, DenseOutputLayer) and table is self.output_layer.weight
        if table is not None and not tied:
            total += table.nbytes
        for layer in self.layers:
            total += layer.attn_norm.nbytes + layer.ffn_norm.nbytes
            total += sum(m.nbytes() for m in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return total

    @torch.inference_mode()
    def __call__(
        self,
        tokens: Sequence[int],
        cache: KVCache,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
        greedy_only: bool = False,
    ) -> torch.Tensor:
        """Append ``tokens`` to ``cache``; logits (rows, vocab) fp32 of the last ``keep`` (0: all),
        the greedy choice among each row's ``allowed`` tokens exact (``ModelPass``)."""
        rows, start = len(tokens), cache.length
        end = start + rows
        if end > self.shape.max_context:
            raise ValueError(f"{end} positions exceed the model's context of {self.shape.max_context}")
        cache.reserve(rows)
        h = self.embed(torch.tensor(list(tokens), dtype=torch.long))
        rotary = self._rotations(end)[start:end, None, :] * self.head_scale  # (rows, heads + kv_heads, half)
        if self.native_layers is not None:
            h = self.native_layers(h, rotary, cache.kv, start)
        elif self.native is not None:
            for index, layer in enumerate(self.layers):
                h = self._native_attention(index, layer, h, rotary, cache, start)
                h = self._native_feed_forward(layer, h)
        else:
            h = self._torch_layers(h, rotary, cache, start, end)
        cache.length = end
        normed = self._rms_norm(h, self.norm)
        cache.hidden[start:end] = normed
        logits = self.output_layer(normed[-keep:] if keep else normed, allowed, greedy_only)
        if rows >= TRIM_ROWS:
            del h, normed
            # the pass's activations, back to the OS (``speculative_complete/decoding/memory.py``)
            trim_heap()
        return logits

    def _torch_layers(
        self, h: torch.Tensor, rotary: torch.Tensor, cache: KVCache, start: int, end: int
    ) -> torch.Tensor:
        """The layers on torch's ops: v's heads rotated by ones beside q's and k's, and a mask
        over whole key blocks."""
        rotary = torch.cat([rotary, self.unrotated.expand(h.shape[0], -1, -1)], dim=1)
        span = -(-end // KEY_BLOCK) * KEY_BLOCK  # keys read, in whole blocks
        # Row i sees keys up to start + i.
        mask = torch.full((h.shape[0], span), float("-inf")).triu_(start + 1)
        for index, layer in enumerate(self.layers):
            h = h + self._attention(index, layer, h, rotary, mask, cache, start, end)
            h = h + self._feed_forward(layer, h)
        return h

    def _rms_norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The model's RMS norm of each row of ``h``: the native kernels' where the products run
        there (one call, where torch's composite norm is several ops a row)."""
        if self.native is not None:
            return self.native.rms_norm(h, weight, self.shape.norm_eps)
        return F.rms_norm(h, (self.shape.dim,), weight, self.shape.norm_eps)

    def _rotations(self, end: int) -> torch.Tensor:
        """The rotary table through position ``end`` at least."""
        if end > len(self.rotary):
            grown = min(self.shape.max_context, -(-end // ROTARY_CHUNK) * ROTARY_CHUNK)
            self.rotary = torch.cat([self.rotary, rotary_table(self.shape, len(self.rotary), grown)])
        return self.rotary

    def _attention(
        self,
        index: int,
        layer: LlamaLayer,
        h: torch.Tensor,
        rotary: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        start: int,
        end: int,
    ) -> torch.Tensor:
        s, rows = self.shape, h.shape[0]
        qkv = projected_heads(layer, s, self._rms_norm(h, layer.attn_norm))
        all_heads = s.heads + 2 * s.kv_heads
        qkv = torch.view_as_complex(qkv.view(rows, all_heads, s.head_dim // 2, 2)) * rotary
        qkv = torch.view_as_real(qkv).view(rows, all_heads, s.head_dim)  # q and k rotated, v as is
        kv = cache.layer(index)
        kv[:, start:end] = qkv[:, s.heads :].transpose(0, 1)
        span = mask.shape[1]
        keys, values = kv[: s.kv_heads, :span], kv[s.kv_heads :, :span]
        # Query heads sharing a kv head are stacked as rows: (kv_heads, group * rows, head_dim).
        q = qkv[:, : s.heads].reshape(rows, s.kv_heads, s.group, s.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(s.kv_heads, s.group * rows, s.head_dim)
        padded = max(0, self.min_attention_rows - q.shape[1])
        if padded:
            q = torch.cat([q, q[:, :1].expand(-1, padded, -1)], dim=1)
        scores = torch.bmm(q, keys.transpose(1, 2))
        scores[:, : s.group * rows].view(s.kv_heads, s.group, rows, span).add_(mask)
        attended = self._weighted_values(torch.softmax(scores, dim=-1), values)[:, : s.group * rows]
        merged = attended.view(s.kv_heads, s.group, rows, s.head_dim).permute(2, 0, 1, 3)
        return layer.out(merged.reshape(rows, s.attention_dim))

    def _native_attention(
        self, index: int, layer: LlamaLayer, h: torch.Tensor, rotary: torch.Tensor, cache: KVCache, start: int
    ) -> torch.Tensor:
        """``h`` plus its attention, on the native kernels: rotation, the cache's new keys and
        values, and the attention in one call, the residual summed in the output's product."""
        assert self.native is not None
        qkv = projected_heads(layer, self.shape, self._rms_norm(h, layer.attn_norm))
        attended = self.native.attention(qkv, rotary, cache.layer(index), start)
        return plus_product(layer.out, attended.view(h.shape[0], self.shape.attention_dim), h)

    def _native_feed_forward(self, layer: LlamaLayer, h: torch.Tensor) -> torch.Tensor:
        """``h`` plus its feed-forward, on the native kernels (one call for the SwiGLU)."""
        assert self.native is not None
        gate_up = layer.gate_up(self._rms_norm(h, layer.ffn_norm))
        return plus_product(layer.down, self.native.swiglu(gate_up), h)

    @staticmethod
    def _weighted_values(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``probs @ values`` summed block by block in a fixed order; blocks past a row's keys add
        exact zeros, so the row's result does not depend on how many keys the pass reads. One
        product per block, on views of the cache (a product over all blocks at once would copy
        the values out of the larger buffer first)."""
        out = torch.bmm(probs[:, :, :KEY_BLOCK], values[:, :KEY_BLOCK])
        for first in range(KEY_BLOCK, probs.shape[2], KEY_BLOCK):
            block = slice(first, first + KEY_BLOCK)
            out = out + torch.bmm(probs[:, :, block], values[:, block])
        return out

    def _feed_forward(self, layer: LlamaLayer, h: torch.Tensor) -> torch.Tensor:
        s = self.shape
        gate, up = layer.gate_up(self._rms_norm(h, layer.ffn_norm)).split(s.ffn, dim=-1)
        return layer.down(F.silu(gate) * up)


def plus_product(linear: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x)``: in the product's own call where it runs on the native kernels
    (each element the same sum, one op fewer)."""
    if isinstance(linear, NativeLinear) and linear.order is None:
        return linear(x, residual)
    return residual + linear(x)


def projected_heads(layer: LlamaLayer, shape: LlamaShape, normed: torch.Tensor) -> torch.Tensor:
    """q, k and v heads of ``normed`` rows, fp32 (rows, heads + 2 kv_heads, head_dim): the
    projection, its biases where the model has them, and each query and key head's own RMS norm
    where it has those. Every step acts on each row alone."""
    qkv = layer.qkv(normed).float()
    if layer.qkv_bias is not None:
        qkv = qkv + layer.qkv_bias
    qkv = qkv.view(normed.shape[0], shape.heads + 2 * shape.kv_heads, shape.head_dim)
    if layer.q_norm is None or layer.k_norm is None:
        return qkv
    rotated = shape.heads + shape.kv_heads
    q = F.rms_norm(qkv[:, : shape.heads], (shape.head_dim,), layer.q_norm, shape.norm_eps)
    k = F.rms_norm(qkv[:, shape.heads : rotated], (shape.head_dim,), layer.k_norm, shape.norm_eps)
    return torch.cat([q, k, qkv[:, rotated:]], dim=1)


@functools.cache
def attention_row_floor(kv_heads: int, head_dim: int) -> int:
    """The fewest query rows from which each row of the two attention products comes out exactly
    as in a longer pass on this machine: MKL sums a product of few rows in another order (up to
    2 rows on one CPU, 3 on an AVX-512 one, found the hard way), so fewer rows are padded.

    Found by trying, once per process and shape (tens of ms): the products of
    ``LlamaForward._attention``, with its shapes and layouts (queries fresh and contiguous, keys
    and values a slice of a larger cache), for each row count in ``PROBE_ROWS`` against a pass of
    ``PROBE_REFERENCE_ROWS``. A fixed padding would be either too small for some CPU (speculative
    output then differs from plain decoding) or costly everywhere (16 rows where a CPU needs 4
    make every step dearer).
    """
    generator = torch.Generator().manual_seed(0)
    spans = (KEY_BLOCK, 2 * KEY_BLOCK, 4 * KEY_BLOCK)
    capacity = spans[-1] + KEY_BLOCK
    cache = torch.randn(2, kv_heads, capacity, head_dim, generator=generator)
    queries = torch.randn(kv_heads, PROBE_REFERENCE_ROWS, head_dim, generator=generator)
    agrees = dict.fromkeys(PROBE_ROWS, True)
    for span in spans:
        keys, values = cache[0, :, :span], cache[1, :, :span]
        scores = torch.bmm(queries, keys.transpose(1, 2))
        probs = torch.softmax(scores, dim=-1)
        weighted = LlamaForward._weighted_values(probs, values)
        for rows in PROBE_ROWS:
            few = torch.bmm(queries[:, :rows].contiguous(), keys.transpose(1, 2))
            few_weighted = LlamaForward._weighted_values(probs[:, :rows].contiguous(), values)
            same = torch.equal(few, scores[:, :rows]) and torch.equal(few_weighted, weighted[:, :rows])
            agrees[rows] = agrees[rows] and same
    if not all(agrees[rows] for rows in PROBE_ROWS if rows >= MAX_ATTENTION_ROWS):
        log.warning("attention rows differ by the pass's row count on this CPU: outputs may vary")
        return MAX_ATTENTION_ROWS
    floor = MAX_ATTENTION_ROWS
    for rows in range(MAX_ATTENTION_ROWS, 0, -1):
        if not agrees[rows]:
            break
        floor = rows
    return floor
