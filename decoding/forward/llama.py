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

Weights come from a GGUF file's own quantized blocks (``from_gguf``) or from a transformers
Llama quantized at load (``from_transformers``). Rotary embeddings act on adjacent pairs, as in
llama.cpp's layout; a transformers checkpoint's q and k rows are permuted into it at load.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from decoding.forward.gguf_header import GgufHeader, GgufTensor, read_header
from decoding.forward.native import (
    Kernels,
    NativeLinear,
    NativeOutputLayer,
    Weight,
    kernels,
    kernels_for_files,
)
from decoding.forward.native.layers import NativeLayers
from decoding.forward.quant.gguf_blocks import QuantTensor, decode_tensor, permute_rows, quantize_dense
from decoding.forward.quant.layers import (
    INT4_N_MULTIPLE,
    CertifiedOutputLayer,
    DenseOutputLayer,
    QuantizedOutputLayer,
    concat_rows,
    linear_for,
)
from decoding.memory import TRIM_ROWS, trim_heap, untouched_zeros

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
# GGUF architectures the lean forward covers: Llama's layout, optionally with q/k/v biases (Qwen2)
# or per-head q/k norms (Qwen3). Where the value is True the file keeps q and k rows in the
# rotate-half order of the model's own checkpoint (llama.cpp's NEOX rotary), which loading
# permutes into adjacent pairs; llama's converter has already permuted them.
LLAMA_ARCHITECTURES = {"llama": False, "qwen2": True, "qwen3": True}
# Per-layer GGUF tensors the lean forward reads; a layer holding any other (an output bias, a
# fused q/k/v, experts, extra norms) is another architecture's.
LAYER_TENSORS = {
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
}
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


class UnsupportedModel(ValueError):
    """The lean forward does not cover this model; the caller falls back to transformers'."""


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float
    max_context: int
    head_size: int = 0  # per attention head; 0: dim // heads (Qwen3's heads are wider)
    rope_scale: float = 1.0  # linear rotary scaling: positions are divided by it (DeepSeek-Coder)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.heads

    @property
    def attention_dim(self) -> int:
        """The width attention's output has, the output projection's input."""
        return self.heads * self.head_dim

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


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
        # (``decoding/draft_head/network.py``) reads. 1/40 of the keys' and values' size.
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
            trim_heap()  # the pass's activations, back to the OS (``decoding/memory.py``)
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


# -- building one ----------------------------------------------------------------------------------
def _pair_orders(shape: LlamaShape) -> dict[str, np.ndarray]:
    """Row orders taking q's and k's rotate-half rows (and their biases) to adjacent pairs."""
    return {
        "q": _rope_order(shape.attention_dim, shape.heads),
        "k": _rope_order(shape.kv_heads * shape.head_dim, shape.kv_heads),
    }


def _rope_order(rows: int, heads: int) -> np.ndarray:
    """Row order taking a transformers q/k projection (rotate-half pairs) to adjacent pairs."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


# The products of a layer, each over the weights named (one output, side by side).
PRODUCTS = {"qkv": ("q", "k", "v"), "out": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def _assemble(
    shape: LlamaShape,
    linear,
    vector,
    embed: Embedding,
    head: torch.nn.Module,
    optional=None,
    native: Kernels | None = None,
) -> LlamaForward:
    """``linear(names, i)`` gives layer i's product over the weights ``names`` (``PRODUCTS``),
    ``vector(name, i)`` a norm's fp32 weights, ``optional(name, i)`` an fp32 bias (``q_bias``,
    ``k_bias``, ``v_bias``) or head norm (``q_norm``, ``k_norm``) where the model has one."""
    optional = optional or (lambda name, i: None)
    layers = []
    for i in range(shape.layers):
        products = {name: linear(parts, i) for name, parts in PRODUCTS.items()}
        layers.append(
            LlamaLayer(
                attn_norm=vector("attn_norm", i),
                ffn_norm=vector("ffn_norm", i),
                **products,
                qkv_bias=joined_qkv_bias(shape, [optional(f"{x}_bias", i) for x in "qkv"]),
                q_norm=optional("q_norm", i),
                k_norm=optional("k_norm", i),
            )
        )
    return LlamaForward(shape, embed, layers, vector("norm", None), head, native)


def _torch_linear(weight):
    """``linear`` for ``_assemble`` from ``weight(name, i)``'s QuantTensors: torch's kernels."""

    def linear(names: tuple[str, ...], i: int) -> torch.nn.Module:
        parts = [weight(name, i) for name in names]
        return linear_for(parts[0] if len(parts) == 1 else concat_rows(parts))

    return linear


def joined_qkv_bias(shape: LlamaShape, biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    """q, k and v's biases as one vector (a missing one zeros); None where the model has none."""
    if all(b is None for b in biases):
        return None
    sizes = [shape.heads * shape.head_dim] + [shape.kv_heads * shape.head_dim] * 2
    return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, sizes, strict=True)])


GGUF_OPTIONAL = {
    "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
}
GGUF_NAMES = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
    "attn_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
}


def gguf_shape(header: GgufHeader) -> LlamaShape:
    """The model's shape from a GGUF header; ``UnsupportedModel`` (with the reason) where the
    lean forward does not cover it."""
    arch = header.get("general.architecture")
    if arch not in LLAMA_ARCHITECTURES:
        raise UnsupportedModel(f"architecture {arch!r} (covered: {', '.join(LLAMA_ARCHITECTURES)})")
    extra = {name.split(".", 2)[2] for name in header.tensors if name.startswith("blk.")} - LAYER_TENSORS
    if extra:
        raise UnsupportedModel(f"layer tensors {', '.join(sorted(extra))}")
    dim = int(header.get(f"{arch}.embedding_length"))
    heads = int(header.get(f"{arch}.attention.head_count"))
    head_dim = int(header.get(f"{arch}.attention.key_length", dim // heads))
    if int(header.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModel("values of another width than keys")
    if int(header.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModel("partial rotary")
    return LlamaShape(
        layers=int(header.get(f"{arch}.block_count")),
        dim=dim,
        heads=heads,
        kv_heads=int(header.get(f"{arch}.attention.head_count_kv", heads)),
        ffn=int(header.get(f"{arch}.feed_forward_length")),
        vocab=int(header.tensors["token_embd.weight"].shape[0]),
        rope_theta=float(header.get(f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=float(header.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_context=int(header.get(f"{arch}.context_length", 2048)),
        head_size=head_dim if head_dim != dim // heads else 0,
        rope_scale=_rope_scale(header, arch),
    )


def _rope_scale(header: GgufHeader, arch: str) -> float:
    """Linear rotary scaling's factor (1 without scaling); any other kind is not covered."""
    kind = header.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return 1.0
    if kind != "linear":
        raise UnsupportedModel(f"rotary scaling {kind!r}")
    return float(header.get(f"{arch}.rope.scaling.factor", 1.0))


def gguf_index(path: str) -> tuple[LlamaShape, dict[str, GgufTensor], bool]:
    """The model's shape, where each tensor lies, and whether q and k rows are in rotate-half order."""
    header = read_header(path)
    return gguf_shape(header), header.tensors, LLAMA_ARCHITECTURES[header.get("general.architecture")]


class GgufWeights:
    """A GGUF file's tensors, memory-mapped, as the lean forward's parts: products on the
    native kernels over the file's own blocks where they multiply every part (else torch's, over
    the blocks' 4-bit terms), norms, biases. Rows of q and k (and their biases and norms) kept in
    rotate-half order (``halves``) are permuted into adjacent pairs."""

    def __init__(self, path: str, dense: bool, kernels: bool = True) -> None:
        """``dense``: weights as fp32 values; ``kernels``: False keeps the native kernels unloaded
        (the weights go to another device)."""
        self.shape, self.index, self.halves = gguf_index(path)
        with open(path, "rb") as file:
            self.mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = np.frombuffer(self.mapping, dtype=np.uint8)
        self.dense = dense
        native = kernels and not dense
        self.native = kernels_for_files() if native else None
        self.pairs, self.pairs_in_head = _pair_orders(self.shape), _rope_order(self.shape.head_dim, 1)
        self.torch_linear = _torch_linear(self.weight)

    def raw(self, name: str) -> tuple[GgufTensor, np.ndarray]:
        t = self.index[name]
        return t, self.data[t.offset : t.offset + t.nbytes]

    def weight(self, kind: str, i: int) -> QuantTensor:
        """Layer i's weight ``kind`` as 4-bit terms (dense fp32 values with ``dense``)."""
        t, raw_bytes = self.raw(f"blk.{i}.{GGUF_NAMES[kind]}.weight")
        loaded = decode_tensor(raw_bytes, t.kind, (t.shape[0], t.shape[-1]))
        if self.dense:
            loaded = QuantTensor(loaded.shape, loaded.kind, values=loaded.dense())
        return permute_rows(loaded, self.pairs[kind]) if self.halves and kind in self.pairs else loaded

    def blocks(self, name: str) -> Weight:
        """A weight's rows in the file's own blocks (mapped, not copied)."""
        t, raw_bytes = self.raw(name)
        return Weight(int(t.kind), raw_bytes.reshape(t.shape[0], -1), t.shape[-1])

    def product_weight(self, name: str) -> Weight:
        """A weight for the native products: packed where the kernels pack its type (``Kernels.pack``),
        its file pages then let go of (the packed copy is what the products read; a row looked
        up in the blocks later maps its page again)."""
        weight = self.blocks(name)
        assert self.native is not None
        packed = self.native.pack(weight)
        if packed is not weight:
            self.release(name)
        return packed

    def release(self, name: str) -> None:
        """Let go of a tensor's file pages (read again from the page cache where used again)."""
        t = self.index[name]
        first = t.offset // mmap.PAGESIZE * mmap.PAGESIZE
        self.mapping.madvise(mmap.MADV_DONTNEED, first, t.offset + t.nbytes - first)

    def linear(self, kinds: tuple[str, ...], i: int) -> torch.nn.Module:
        names = [f"blk.{i}.{GGUF_NAMES[kind]}.weight" for kind in kinds]
        native = self.native
        if native is None or not all(native.supports(self.index[name].kind) for name in names):
            return self.torch_linear(kinds, i)
        weights = [self.product_weight(name) for name in names]
        return NativeLinear(native, weights, self._column_order(kinds, [w.out_features for w in weights]))

    def _column_order(self, kinds: tuple[str, ...], rows: list[int]) -> torch.Tensor | None:
        """The order taking the side-by-side outputs of ``kinds`` (``rows`` each) from rotate-half
        to adjacent pairs; None where they are in order already."""
        if not self.halves or not any(kind in self.pairs for kind in kinds):
            return None
        firsts = np.cumsum([0, *rows[:-1]])
        orders = [
            first + (self.pairs[kind] if kind in self.pairs else np.arange(count))
            for kind, count, first in zip(kinds, rows, firsts, strict=True)
        ]
        return torch.from_numpy(np.concatenate(orders))

    def values(self, name: str) -> torch.Tensor:
        t, raw_values = self.raw(name)
        return torch.from_numpy(quants.dequantize(raw_values, t.kind).astype(np.float32).reshape(-1))

    def vector(self, kind: str, i: int | None) -> torch.Tensor:
        return self.values("output_norm.weight" if i is None else f"blk.{i}.{GGUF_NAMES[kind]}.weight")

    def optional(self, kind: str, i: int) -> torch.Tensor | None:
        name = f"blk.{i}.{GGUF_OPTIONAL[kind]}"
        if name not in self.index:
            return None
        found, target = self.values(name), kind[0]
        if self.halves and kind.endswith("_norm"):
            return found[self.pairs_in_head]
        return found[self.pairs[target]] if self.halves and target in self.pairs else found


def from_gguf(path: str, dense: bool = False) -> LlamaForward:
    """The model in a GGUF file, its quantized blocks kept as they are where a kernel takes them;
    ``dense``: every weight dequantized to fp32 instead (exact), for ``decoding/forward/graphed.py``."""
    file = GgufWeights(path, dense)
    # The output layer: certified exact greedy choices (``CertifiedOutputLayer``) on the native kernels
    # or the 4-bit kernel where its type allows, else dense fp32 (exact for every type). Tied
    # embeddings are looked up in the same table.
    tied = "output.weight" not in file.index
    head = _output_layer(file.native, file.blocks("token_embd.weight" if tied else "output.weight"), dense)
    if not tied and isinstance(head, NativeOutputLayer) and head.weight.packed is not None:
        file.release("output.weight")  # the products read the packed rows, candidates a few of the file's
    if not tied:  # looked up in the file's own blocks: no fp32 copy of a large table
        table = file.blocks("token_embd.weight")
        embed: Embedding = BlockEmbedding(table.blocks, file.index["token_embd.weight"].kind, table.width)
        if file.native is not None and file.native.supports(table.kind):
            embed = functools.partial(file.native.rows, table.kind, table.blocks, width=table.width)
    else:
        embed = head.rows if isinstance(head, CertifiedOutputLayer) else DenseEmbedding(head.weight)
    forward = _assemble(file.shape, file.linear, file.vector, embed, head, file.optional, file.native)
    forward.formats = "+".join(sorted({t.kind.name for t in file.index.values()}))
    return forward


def _output_layer(native: Kernels | None, weight: Weight, dense: bool) -> torch.nn.Module:
    """The output layer for ``weight``: on the native kernels where its bound can be told, else
    on the 4-bit kernel where the type has 4-bit terms, else dense fp32."""
    if native is not None and NativeOutputLayer.fits(native, weight):
        return NativeOutputLayer(native, weight)
    tensor = decode_tensor(
        weight.blocks, GGMLQuantizationType(weight.kind), (weight.out_features, weight.width)
    )
    if not dense and tensor.terms is not None and tensor.shape[0] % INT4_N_MULTIPLE == 0:
        return QuantizedOutputLayer(tensor)
    return DenseOutputLayer(torch.from_numpy(tensor.dense()))


TRANSFORMERS_TYPES = ("llama", "qwen2", "qwen3")  # model types with the lean forward's layout


def transformers_shape(config: Any) -> LlamaShape:
    """The lean forward's shape for a transformers config; ``UnsupportedModel`` where it does
    not cover the model (another layout, sliding windows, rotary scaling other than linear)."""
    model_type = getattr(config, "model_type", "")
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 10000.0)}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if model_type not in TRANSFORMERS_TYPES or rope_type not in ("default", "linear"):
        raise UnsupportedModel(f"model type {model_type!r} with rope {rope}")
    if getattr(config, "mlp_bias", False) or getattr(config, "use_sliding_window", False):
        raise UnsupportedModel("biases in the feed-forward or sliding-window attention")
    if model_type == "llama" and getattr(config, "attention_bias", False):
        raise UnsupportedModel("an output projection bias")
    dim, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or dim // heads
    return LlamaShape(
        layers=config.num_hidden_layers,
        dim=dim,
        heads=heads,
        kv_heads=config.num_key_value_heads,
        ffn=config.intermediate_size,
        vocab=config.vocab_size,
        rope_theta=float(rope["rope_theta"]),
        norm_eps=config.rms_norm_eps,
        max_context=config.max_position_embeddings,
        head_size=head_dim if head_dim != dim // heads else 0,
        rope_scale=float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
    )


TRANSFORMERS_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
}


def from_transformers(model: torch.nn.Module, bits: int) -> LlamaForward:
    """A transformers Llama, Qwen2 or Qwen3, its linear layers quantized at load (``bits`` 4 or
    8; 0 keeps them dense fp32, which the tests use to check this forward against
    transformers'). Its q and k rows (rotate-half pairs) are permuted into adjacent pairs."""
    shape = transformers_shape(model.config)
    blocks = model.model.layers
    pairs, head_norms = _pair_orders(shape), model.config.model_type == "qwen3"

    def weight(kind: str, i: int) -> QuantTensor:
        w = blocks[i].get_submodule(TRANSFORMERS_NAMES[kind]).weight.detach().float().numpy()
        if kind in pairs:
            w = w[pairs[kind]]
        if not bits or w.shape[1] % 32:
            return QuantTensor(w.shape, "F32", values=np.ascontiguousarray(w))
        return quantize_dense(w, bits)

    def vector(kind: str, i: int | None) -> torch.Tensor:
        module = model.model.norm if i is None else blocks[i].get_submodule(TRANSFORMERS_NAMES[kind])
        return module.weight.detach().float().clone()

    def optional(kind: str, i: int) -> torch.Tensor | None:
        layer = blocks[i]
        if kind.endswith("_norm"):
            if not head_norms:
                return None
            weights = layer.get_submodule(TRANSFORMERS_NAMES[kind]).weight.detach().float()
            return weights[_rope_order(shape.head_dim, 1)].clone()
        bias = layer.get_submodule(TRANSFORMERS_NAMES[kind[0]]).bias
        if bias is None:
            return None
        values = bias.detach().float()
        return values[pairs[kind[0]]].clone() if kind[0] in pairs else values.clone()

    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    head_weight = model.lm_head.weight.detach().float()
    table = model.model.embed_tokens.weight.detach().float().clone()
    if bits and head_weight.shape[0] % INT4_N_MULTIPLE == 0 and head_weight.shape[1] % 32 == 0:
        # As GGUF files keep it: the output layer in 8 bits (Q8_0), whatever the rest.
        head: torch.nn.Module = QuantizedOutputLayer(quantize_dense(head_weight.numpy(), 8))
        embed: Embedding = head.rows if tied else DenseEmbedding(table)
    else:
        head = DenseOutputLayer(head_weight)
        embed = DenseEmbedding(head.weight if tied else table)
    forward = _assemble(shape, _torch_linear(weight), vector, embed, head, optional, kernels())
    forward.formats = f"int{bits}" if bits else "F32"
    return forward


__all__ = ["KVCache", "LlamaForward", "LlamaShape", "UnsupportedModel", "from_gguf", "from_transformers"]
