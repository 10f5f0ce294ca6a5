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
construction, in any dtype (``tests/decoding/forward/test_graphed.py`` checks it bit for bit). The
price is small on a GPU: a pass of 1 and of 16 rows cost the same (both read every weight once),
but a prefill of n tokens takes ceil(n / width) replays, several times transformers' one eager pass
over the same tokens; prefix reuse across keystrokes makes most prefills a few tokens.

Each cache owns its buffers (keys and values for ``capacity`` positions) and its graph, captured
at its first pass; the graphs share one memory pool for their intermediates (none outlives its
pass), and the inputs (token ids, positions) and outputs (logits) are buffers of the forward.
On the CPU the same pass runs eagerly: that is what the tests use where there is no GPU.

Weights (``graphed_weights.py``): a GGUF's 4-bit blocks as they are where the kernel takes them
(bf16 only), every other tensor dense in ``dtype`` (``from_gguf_on_device``); or the dense fp32
layers of a ``LlamaForward`` cast to ``dtype`` (``from_lean``): bf16 rounds them (8 bits of
mantissa, below a 4-bit quantization's own error), fp32 keeps them exact. Embeddings are looked up
where the table lies (on the host in a GGUF's blocks: a 7B's table stays off the GPU) and copied
into the pass's input buffer.

Widths: a target feeds every pass at one width. A draft model needs no batch invariance (the
target verifies whatever it proposes, and q is what it really drew from), so it is built with a
one-row width beside the full one: its one-token steps replay a one-row graph, its prompt chunks
the full-width one (``DRAFT_WIDTHS``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from speculative_complete.decoding.forward.assembly import PRODUCTS, joined_qkv_bias
from speculative_complete.decoding.forward.gguf_loader import GgufWeights
from speculative_complete.decoding.forward.graphed_weights import (
    DenseProduct,
    GraphedLayer,
    GraphedWeights,
    Product,
    Rows,
    device_product,
)
from speculative_complete.decoding.forward.llama import (
    BlockEmbedding,
    LlamaForward,
    fingerprint,
    head_scales,
    rotary_table,
)
from speculative_complete.decoding.forward.quant.gguf_blocks import decode_tensor, quantize_dense
from speculative_complete.decoding.forward.quant.layers import concat_rows
from speculative_complete.decoding.forward.shapes import LlamaShape

log = logging.getLogger(__name__)

WIDTH = 16  # rows in every pass: a verify pass of a 15-token draft fits in one
DRAFT_WIDTHS = (1, WIDTH)  # a draft model's passes: one-token steps, and prompt chunks


def pass_widths(draft: bool) -> tuple[int, ...]:
    """The widths a model's passes take: a draft's one-row step beside the full width."""
    return DRAFT_WIDTHS if draft else (WIDTH,)


CAPACITY = 4096  # cache positions (attention reads them all): 94 MB a cache for SmolLM2 in bf16


class GraphedCache:
    """Keys and values for ``capacity`` positions; cropping moves an index (``DynamicCache``'s
    ``crop`` and ``get_seq_length``, as the engine and the prefix store expect)."""

    def __init__(self, shape: LlamaShape, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        size = (shape.layers, shape.kv_heads, capacity, shape.head_dim)
        self.keys = torch.zeros(size, device=device, dtype=dtype)
        self.values = torch.zeros(size, device=device, dtype=dtype)
        self.hidden = torch.zeros(capacity, shape.dim, device=device)  # post-norm, as in ``KVCache``
        self.length = 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # one per pass width, captured at first use

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
        shape: LlamaShape,
        weights: GraphedWeights,
        device: torch.device,
        dtype: torch.dtype,
        widths: Sequence[int] = (WIDTH,),
        capacity: int = CAPACITY,
    ) -> None:
        s = shape
        self.device, self.dtype = device, dtype
        self.widths = tuple(sorted(set(widths)))
        self.width = self.widths[-1]
        self.capacity = min(capacity, s.max_context)
        self.shape, self.weights = shape, weights
        self.max_context = self.capacity - self.width  # padded rows of the last pass need room too
        self.formats = f"{weights.formats} as {str(dtype).removeprefix('torch.')} on {device.type}"
        self.rotary = rotary_table(s)[: self.capacity].to(device)
        self.head_scale = head_scales(s).to(device)
        # Which target a draft head was trained for: the lean forward's own fingerprint, since
        # this one's weights are rounded to ``dtype`` (``LlamaForward.fingerprint``).
        self.fingerprint = weights.fingerprint
        # A pass of up to ``width`` tokens costs one replay; the engine's cost model starts here.
        sizes = (1, self.width, self.width + 1, 4 * self.width)
        self.cost_prior = {n: float(math.ceil(n / self.width)) for n in sizes}
        self._embedded = torch.zeros(self.width, s.dim, device=device, dtype=dtype)
        self._positions = torch.zeros(self.width, dtype=torch.long, device=device)
        self._key_index = torch.arange(self.capacity, device=device)
        self._logits = torch.zeros(self.width, s.vocab, device=device)
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self._keeper: GraphedCache | None = None
        self.warmup_s = self._warm_up()

    @classmethod
    def from_lean(
        cls, lean: LlamaForward, device: torch.device, dtype: torch.dtype, bits: int = 0, **kwargs
    ) -> GraphedForward:
        """A lean forward of dense fp32 layers (``DenseLinear``) moved to ``device`` in ``dtype``
        (``bits`` 4: quantized at load, ``dense_weights``)."""
        return cls(lean.shape, dense_weights(lean, device, dtype, bits), device, dtype, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self.shape.vocab

    def new_cache(self) -> GraphedCache:
        return GraphedCache(self.shape, self.capacity, self.device, self.dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> (rows, dim) fp32 embeddings on the device, as a draft head reads them."""
        return self.weights.embed(ids).to(self.device).float()

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the output layer, fp32 on the device (``ModelPass.output_rows``)."""
        return self.weights.output_rows(ids).to(self.device).float()

    def nbytes(self) -> int:
        """Bytes of weights on the device (a tied embedding counted once)."""
        return self.weights.nbytes()

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
        """One pass of the narrowest width that holds ``piece``, padded with its last token, at
        the next positions."""
        width = next(w for w in self.widths if w >= len(piece))
        padded = piece + piece[-1:] * (width - len(piece))
        self._embedded[:width].copy_(self.weights.embed(torch.tensor(padded)))
        self._positions.copy_(torch.arange(cache.length, cache.length + self.width))
        if self._pool is None:
            self._pass(width, cache)
            return
        graph = cache.graphs.get(width)
        if graph is None:
            graph = cache.graphs[width] = self._capture(width, cache)
        graph.replay()

    def _capture(self, width: int, cache: GraphedCache) -> torch.cuda.CUDAGraph:
        """The pass over ``cache`` recorded once; it writes only buffers that outlive it."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._pass(width, cache)
        return graph

    def _warm_up(self) -> float:
        """Run each width's pass once eagerly (libraries pick and load their kernels) and, on CUDA,
        capture and replay its graph, so the first request pays for none of it. Seconds taken."""
        began = time.perf_counter()
        with torch.inference_mode():
            cache = self.new_cache()
            for width in self.widths:
                if self._pool is not None:
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        self._pass(width, cache)
                    torch.cuda.current_stream().wait_stream(side)
                self([0] * width, cache)
                cache.crop(0)
            if self._pool is not None:
                torch.cuda.synchronize(self.device)
                # The shared pool lives as long as one of its graphs: keep this one, or the pool
                # is freed with the first cache that goes and the next capture fails.
                self._keeper = cache
        return time.perf_counter() - began

    def _pass(self, width: int, cache: GraphedCache) -> None:
        """The whole pass of ``width`` rows on the static buffers: embedded rows and positions
        in, logits and the cache's keys, values and hidden states out."""
        s, positions = self.shape, self._positions[:width]
        h = self._embedded[:width]
        rotary = self.rotary[positions][:, None, :] * self.head_scale  # (width, heads + kv_heads, half)
        mask = torch.zeros(width, self.capacity, device=self.device, dtype=self.dtype)
        mask.masked_fill_(self._key_index[None, :] > positions[:, None], float("-inf"))
        mask = mask.repeat(s.group, 1)  # one row per stacked query row (``_attention``)
        for index, layer in enumerate(self.weights.layers):
            h = h + self._attention(layer, h, rotary, mask, cache.keys[index], cache.values[index])
            h = h + self._feed_forward(layer, h)
        normed = F.rms_norm(h, (s.dim,), self.weights.final_norm, s.norm_eps)
        cache.hidden.index_copy_(0, positions, normed.float())
        self._logits[:width].copy_(self.weights.output(normed))

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
        s, rows = self.shape, h.shape[0]
        positions = self._positions[:rows]
        qkv = layer.qkv(F.rms_norm(h, (s.dim,), layer.attn_norm, s.norm_eps), layer.qkv_bias)
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
        keys.index_copy_(1, positions, qk[:, s.heads :].transpose(0, 1))
        values.index_copy_(1, positions, v.transpose(0, 1))
        # Query heads sharing a kv head are stacked as rows: (1, kv_heads, group * rows, head_dim),
        # so one fused attention call serves grouped queries (its kernels work in fp32 inside).
        q = qk[:, : s.heads].reshape(rows, s.kv_heads, s.group, s.head_dim).permute(1, 2, 0, 3)
        q = q.reshape(1, s.kv_heads, s.group * rows, s.head_dim)
        attended = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, scale=1.0)
        merged = attended.view(s.kv_heads, s.group, rows, s.head_dim).permute(2, 0, 1, 3)
        return layer.out(merged.reshape(rows, s.attention_dim))

    def _feed_forward(self, layer: GraphedLayer, h: torch.Tensor) -> torch.Tensor:
        s = self.shape
        normed = F.rms_norm(h, (s.dim,), layer.ffn_norm, s.norm_eps)
        gate, up = layer.gate_up(normed).split(s.ffn, dim=-1)
        return layer.down(F.silu(gate) * up)


def _moved(t: torch.Tensor | None, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(device, dtype).contiguous()


def _rows_of(table: torch.Tensor) -> Rows:
    def rows(ids: torch.Tensor) -> torch.Tensor:
        return table[ids.to(table.device)]

    return rows


def dense_weights(
    lean: LlamaForward, device: torch.device, dtype: torch.dtype, bits: int = 0
) -> GraphedWeights:
    """A lean forward's dense fp32 layers (``DenseLinear``) on ``device`` in ``dtype``; its tied or
    dense embedding table there too. ``bits`` 4: each layer's products quantized at load as Q4_1
    blocks (``quantize_dense``, what a GGUF of that type would hold) on the 4-bit kernel, the
    output layer kept dense (a GGUF keeps it in 8 bits, which are dense here)."""

    def layer_product(module) -> Product:
        if bits != 4:
            return dense(module)
        return device_product(quantize_dense(module.weight.numpy(), 4), device, dtype)

    def dense(module) -> Product:
        return DenseProduct(module.weight.to(device, dtype).contiguous())

    layers = [
        GraphedLayer(
            attn_norm=_moved(layer.attn_norm, device, dtype),
            qkv=layer_product(layer.qkv),
            out=layer_product(layer.out),
            ffn_norm=_moved(layer.ffn_norm, device, dtype),
            gate_up=layer_product(layer.gate_up),
            down=layer_product(layer.down),
            qkv_bias=_moved(layer.qkv_bias, device, dtype),
            q_norm=_moved(layer.q_norm, device, dtype),
            k_norm=_moved(layer.k_norm, device, dtype),
        )
        for layer in lean.layers
    ]
    output = dense(lean.output_layer)
    table = lean.embedding_table
    tied = table is None or table.data_ptr() == lean.output_layer.weight.data_ptr()
    rows = _rows_of(output.weight if tied else table.to(device, dtype))
    norm = _moved(lean.norm, device, dtype)
    formats = "Q4_1 at load" if bits == 4 else lean.formats
    return GraphedWeights(layers, norm, output, rows, _rows_of(output.weight), lean.fingerprint, formats)


def from_gguf_on_device(path: str, device: torch.device, dtype: torch.dtype, **kwargs) -> GraphedForward:
    """A GGUF's Llama on ``device``: its 4-bit blocks as they are where the kernel takes them,
    the rest dense in ``dtype``; embeddings and output rows looked up in the file's blocks on the
    host (``BlockEmbedding``)."""
    file = GgufWeights(path, dense=False, kernels=False)
    s = file.shape

    def product(i: int, kinds: tuple[str, ...]) -> Product:
        parts = [file.weight(kind, i) for kind in kinds]
        return device_product(parts[0] if len(parts) == 1 else concat_rows(parts), device, dtype)

    place = (device, dtype)

    def optional(kind: str, i: int) -> torch.Tensor | None:
        return _moved(file.optional(kind, i), device, dtype)

    layers = [
        GraphedLayer(
            attn_norm=file.vector("attn_norm", i).to(device, dtype),
            ffn_norm=file.vector("ffn_norm", i).to(device, dtype),
            **{name: product(i, kinds) for name, kinds in PRODUCTS.items()},
            qkv_bias=_moved(joined_qkv_bias(s, [file.optional(f"{x}_bias", i) for x in "qkv"]), *place),
            q_norm=optional("q_norm", i),
            k_norm=optional("k_norm", i),
        )
        for i in range(s.layers)
    ]
    out_name = "output.weight" if "output.weight" in file.index else "token_embd.weight"
    blocks, embedding = file.blocks(out_name), file.blocks("token_embd.weight")
    out_kind = file.index[out_name].kind
    output = device_product(decode_tensor(blocks.blocks, out_kind, (s.vocab, s.dim)), device, dtype)
    exact_rows = BlockEmbedding(blocks.blocks, out_kind, blocks.width)
    norm = file.vector("norm", None)
    identity = fingerprint(s.layers, s.dim, s.vocab, norm, exact_rows)  # the lean forward's
    output_rows: Rows = exact_rows
    embed: Rows = BlockEmbedding(embedding.blocks, file.index["token_embd.weight"].kind, embedding.width)
    if out_name == "token_embd.weight" and isinstance(output, DenseProduct):
        embed = output_rows = _rows_of(output.weight)  # the tied table is on the device anyway
    weights = GraphedWeights(
        layers,
        norm.to(device, dtype),
        output,
        embed,
        output_rows,
        identity,
        "+".join(sorted({t.kind.name for t in file.index.values()})),
    )
    return GraphedForward(s, weights, device, dtype, **kwargs)


__all__ = [
    "CAPACITY",
    "DRAFT_WIDTHS",
    "WIDTH",
    "GraphedCache",
    "GraphedForward",
    "dense_weights",
    "from_gguf_on_device",
    "pass_widths",
]
