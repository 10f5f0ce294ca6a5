"""The lean Llama forward on a GPU: every pass at one width, replayed from a CUDA graph.

Why a graph: a decode step of a small model on a GPU is bound by launches, not by arithmetic.
SmolLM2-135M's step is hundreds of small kernels (30 layers of norms, products, rotary, attention);
eager PyTorch spends tens of microseconds of host time on each while the GPU mostly waits. A CUDA
graph records the kernels of one pass once and replays them with one launch, every kernel back to
back, several times faster than the eager step; what is left is the kernels' own count (~20 a
layer). ``torch.compile`` over the pass gained too little for its warm-up, so it is not used.
(Figures: ``benchmarks/README.md``, "Measurements behind design choices", from ``pass_bench.py
--device cuda``.)

Why one width: speculative greedy output must equal plain greedy decoding token for token. GPU
matrix libraries choose kernels by shape, and two kernels add a row's products in different
orders, so in bf16 a row's logits would depend on how many rows rode in its pass and near-ties
would flip. Here every pass (a decode step, a verify pass, each chunk of a prefill) feeds
exactly ``width`` rows, padded, and attends over the cache's whole capacity, masked. Every row is
then computed by the same kernels on the same shapes whatever pass it rode in: batch-invariant by
construction, in any dtype (``tests/test_graphed.py`` checks it bit for bit). The price is small
on a GPU: a pass of 1 and of 16 rows cost the same (both read every weight once), but a prefill
of n tokens takes ceil(n / width) replays, several times transformers' one eager pass over the
same tokens; prefix reuse across keystrokes makes most prefills a few tokens.

Each cache owns its buffers (keys and values for ``capacity`` positions) and its graph, captured
at its first pass; the graphs share one memory pool for their intermediates (none outlives its
pass), and the inputs (token ids, positions) and outputs (logits) are buffers of the forward.
On the CPU the same pass runs eagerly: that is what the tests use where there is no GPU.

Weights are the dense fp32 layers of a ``LlamaForward`` (a GGUF's blocks dequantized exactly,
``from_gguf(dense=True)``), cast to ``dtype`` on the device: bf16 rounds them there (8 bits of
mantissa, below the 4-bit quantization's own error), fp32 keeps them exact.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from decoding.forward.llama import LlamaForward, LlamaShape

log = logging.getLogger(__name__)

WIDTH = 16  # rows in every pass: a verify pass of a 15-token draft fits in one
CAPACITY = 4096  # cache positions (attention reads them all): 94 MB a cache for SmolLM2 in bf16


@dataclass
class GraphedLayer:
    attn_norm: torch.Tensor
    qkv: torch.Tensor  # (out, in) weights, rotary pairs adjacent as in ``LlamaForward``
    out: torch.Tensor
    ffn_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    qkv_bias: torch.Tensor | None = None  # as in ``LlamaLayer``
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class GraphedCache:
    """Keys and values for ``capacity`` positions; cropping moves an index (``DynamicCache``'s
    ``crop`` and ``get_seq_length``, as the engine and the prefix store expect)."""

    def __init__(self, shape: LlamaShape, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        size = (shape.layers, shape.kv_heads, capacity, shape.head_dim)
        self.keys = torch.zeros(size, device=device, dtype=dtype)
        self.values = torch.zeros(size, device=device, dtype=dtype)
        self.hidden = torch.zeros(capacity, shape.dim, device=device)  # post-norm, as in ``KVCache``
        self.length = 0
        self.graph: torch.cuda.CUDAGraph | None = None

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        """``n`` < 0 drops that many tokens from the end; otherwise keeps the first ``n``."""
        self.length = max(0, self.length + n) if n < 0 else min(self.length, n)

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.hidden.nbytes


class GraphedForward:
    """``ModelPass`` for a Llama on one device: fixed-width passes, graphed on CUDA."""

    def __init__(
        self,
        lean: LlamaForward,
        device: torch.device,
        dtype: torch.dtype,
        width: int = WIDTH,
        capacity: int = CAPACITY,
    ) -> None:
        s = lean.shape
        self.device, self.dtype, self.width = device, dtype, width
        self.capacity = min(capacity, s.max_context)
        self.shape = s
        self.max_context = self.capacity - width  # padded rows of the last pass need room too
        self.formats = f"{lean.formats} as {str(dtype).removeprefix('torch.')} on {device.type}"
        self.layers = [_layer(layer, device, dtype) for layer in lean.layers]
        self.final_norm = lean.norm.to(device, dtype)
        self.output = lean.output_layer.weight.to(device, dtype)
        table = lean.embedding_table
        tied = table is None or table.data_ptr() == lean.output_layer.weight.data_ptr()
        self.table = self.output if tied else table.to(device, dtype)
        self.rotary = lean.rotary[: self.capacity].to(device)
        self.head_scale = lean.head_scale.to(device)
        # Which target a draft head was trained for: the lean forward's own fingerprint, since
        # this one's weights are rounded to ``dtype`` (``LlamaForward.fingerprint``).
        self.fingerprint = lean.fingerprint
        # A pass of up to ``width`` tokens costs one replay; the engine's cost model starts here.
        self.cost_prior = {n: float(math.ceil(n / width)) for n in (1, width, width + 1, 4 * width)}
        self._ids = torch.zeros(width, dtype=torch.long, device=device)
        self._positions = torch.zeros(width, dtype=torch.long, device=device)
        self._key_index = torch.arange(self.capacity, device=device)
        self._logits = torch.zeros(width, s.vocab, device=device)
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self._keeper: GraphedCache | None = None
        self.warmup_s = self._warm_up()

    @property
    def vocab_size(self) -> int:
        return self.shape.vocab

    def new_cache(self) -> GraphedCache:
        return GraphedCache(self.shape, self.capacity, self.device, self.dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> (rows, dim) fp32 embeddings on the device, as a draft head reads them."""
        return self.table[ids.to(self.device)].float()

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the output layer, fp32 on the device (``ModelPass.output_rows``)."""
        return self.output[ids.to(self.device)].float()

    def nbytes(self) -> int:
        """Bytes of weights on the device (a tied embedding counted once)."""
        tensors = [self.final_norm, self.output]
        if self.table is not self.output:
            tensors.append(self.table)
        for layer in self.layers:
            tensors += [layer.attn_norm, layer.qkv, layer.out, layer.ffn_norm, layer.gate_up, layer.down]
        return sum(t.nbytes for t in tensors)

    @torch.inference_mode()
    def __call__(
        self,
        tokens: Sequence[int],
        cache: GraphedCache,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
        greedy_only: bool = False,
    ) -> torch.Tensor:
        """Append ``tokens`` to ``cache``; logits (rows, vocab) fp32 of the last ``keep`` (0: all),
        every one computed by the same dense layer (``allowed`` and ``greedy_only`` change
        nothing)."""
        tokens = list(tokens)
        if not tokens:
            return self._logits[:0].clone()
        end = cache.length + len(tokens)
        if end > self.max_context:
            raise ValueError(f"{end} positions exceed this forward's context of {self.max_context}")
        first_kept = len(tokens) - keep if keep else 0
        rows = []
        for start in range(0, len(tokens), self.width):
            piece = tokens[start : start + self.width]
            self._run(piece, cache)
            if start + len(piece) > first_kept:
                rows.append(self._logits[max(0, first_kept - start) : len(piece)].clone())
            cache.length += len(piece)
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def _run(self, piece: list[int], cache: GraphedCache) -> None:
        """One pass of ``width`` rows: ``piece`` padded with its last token, at the next positions."""
        padded = piece + piece[-1:] * (self.width - len(piece))
        self._ids.copy_(torch.tensor(padded))
        self._positions.copy_(torch.arange(cache.length, cache.length + self.width))
        if self._pool is None:
            self._pass(cache.keys, cache.values, cache.hidden)
            return
        if cache.graph is None:
            cache.graph = self._capture(cache)
        cache.graph.replay()

    def _capture(self, cache: GraphedCache) -> torch.cuda.CUDAGraph:
        """The pass over ``cache`` recorded once; it writes only buffers that outlive it."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._pass(cache.keys, cache.values, cache.hidden)
        return graph

    def _warm_up(self) -> float:
        """Run the pass once eagerly (libraries pick and load their kernels) and, on CUDA, capture
        and replay one graph, so the first request pays for none of it. Seconds taken."""
        began = time.perf_counter()
        with torch.inference_mode():
            cache = self.new_cache()
            if self._pool is not None:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self._pass(cache.keys, cache.values, cache.hidden)
                torch.cuda.current_stream().wait_stream(side)
            self([0], cache)
            if self._pool is not None:
                torch.cuda.synchronize(self.device)
                # The shared pool lives as long as one of its graphs: keep this one, or the pool
                # is freed with the first cache that goes and the next capture fails.
                self._keeper = cache
        return time.perf_counter() - began

    def _pass(self, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor) -> None:
        """The whole pass on the static buffers: ids and positions in, logits and a cache's
        keys, values and hidden states out."""
        s, positions = self.shape, self._positions
        h = self.table[self._ids]
        rotary = self.rotary[positions][:, None, :] * self.head_scale  # (width, heads + kv_heads, half)
        mask = torch.zeros(self.width, self.capacity, device=self.device, dtype=self.dtype)
        mask.masked_fill_(self._key_index[None, :] > positions[:, None], float("-inf"))
        mask = mask.repeat(s.group, 1)  # one row per stacked query row (``_attention``)
        for index, layer in enumerate(self.layers):
            h = h + self._attention(layer, h, rotary, mask, keys[index], values[index])
            h = h + self._feed_forward(layer, h)
        normed = F.rms_norm(h, (s.dim,), self.final_norm, s.norm_eps)
        hidden.index_copy_(0, positions, normed.float())
        self._logits.copy_(F.linear(normed, self.output))

    def _attention(
        self,
        layer: GraphedLayer,
        h: torch.Tensor,
        rotary: torch.Tensor,
        mask: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """One layer's attention; ``keys``/``values``: its (kv_heads, capacity, head_dim) cache."""
        s, rows = self.shape, self.width
        qkv = F.linear(F.rms_norm(h, (s.dim,), layer.attn_norm, s.norm_eps), layer.qkv, layer.qkv_bias)
        qkv = qkv.view(rows, s.heads + 2 * s.kv_heads, s.head_dim)
        rotated = s.heads + s.kv_heads
        qk = qkv[:, :rotated]
        if layer.q_norm is not None and layer.k_norm is not None:
            q = F.rms_norm(qk[:, : s.heads], (s.head_dim,), layer.q_norm, s.norm_eps)
            qk = torch.cat([q, F.rms_norm(qk[:, s.heads :], (s.head_dim,), layer.k_norm, s.norm_eps)], 1)
        qk = qk.float().reshape(rows, rotated, s.head_dim // 2, 2)
        qk = torch.view_as_real(torch.view_as_complex(qk) * rotary).view(rows, rotated, s.head_dim)
        qk = qk.to(self.dtype)
        v = qkv[:, rotated:]
        keys.index_copy_(1, self._positions, qk[:, s.heads :].transpose(0, 1))
        values.index_copy_(1, self._positions, v.transpose(0, 1))
        # Query heads sharing a kv head are stacked as rows: (1, kv_heads, group * rows, head_dim),
        # so one fused attention call serves grouped queries (its kernels work in fp32 inside).
        q = qk[:, : s.heads].reshape(rows, s.kv_heads, s.group, s.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(1, s.kv_heads, s.group * rows, s.head_dim)
        attended = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, scale=1.0)
        merged = attended.view(s.kv_heads, s.group, rows, s.head_dim).permute(2, 0, 1, 3)
        return F.linear(merged.reshape(rows, s.attention_dim), layer.out)

    def _feed_forward(self, layer: GraphedLayer, h: torch.Tensor) -> torch.Tensor:
        s = self.shape
        normed = F.rms_norm(h, (s.dim,), layer.ffn_norm, s.norm_eps)
        gate, up = F.linear(normed, layer.gate_up).split(s.ffn, dim=-1)
        return F.linear(F.silu(gate) * up, layer.down)


def _layer(layer, device: torch.device, dtype: torch.dtype) -> GraphedLayer:
    """A ``LlamaLayer`` of dense fp32 layers (``DenseLinear``) moved to ``device`` in ``dtype``."""

    def move(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device, dtype).contiguous()

    return GraphedLayer(
        attn_norm=move(layer.attn_norm),
        qkv=move(layer.qkv.weight),
        out=move(layer.out.weight),
        ffn_norm=move(layer.ffn_norm),
        gate_up=move(layer.gate_up.weight),
        down=move(layer.down.weight),
        qkv_bias=move(layer.qkv_bias),
        q_norm=move(layer.q_norm),
        k_norm=move(layer.k_norm),
    )


__all__ = ["CAPACITY", "WIDTH", "GraphedCache", "GraphedForward"]
