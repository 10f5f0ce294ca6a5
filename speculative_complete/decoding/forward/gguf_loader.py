"""A GGUF file onto the lean forward (``from_gguf``): its tensors memory-mapped, its quantized
blocks multiplied where they lie (the native kernels where built, else torch's 4-bit kernel over
the blocks' terms), q's and k's rows taken to adjacent pairs where the architecture's row says the
file keeps them in rotate-half order (``architectures.py``).
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Collection

import numpy as np
import torch
from gguf import GGMLQuantizationType, TokenType, quants

from speculative_complete.decoding.forward.assembly import assemble, pair_orders, rope_order, torch_linear
from speculative_complete.decoding.forward.gguf_header import GgufTensor, read_header
from speculative_complete.decoding.forward.llama import (
    BlockEmbedding,
    DenseEmbedding,
    Embedding,
    LlamaForward,
)
from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.native.linear import NativeLinear
from speculative_complete.decoding.forward.native.output_layer import (
    DRAFT_ROWS,
    DraftOutputLayer,
    NativeOutputLayer,
)
from speculative_complete.decoding.forward.native.serving import kernels_for_files
from speculative_complete.decoding.forward.native.weights import Weight
from speculative_complete.decoding.forward.quant.gguf_blocks import QuantTensor, decode_tensor, permute_rows
from speculative_complete.decoding.forward.quant.layers import (
    INT4_N_MULTIPLE,
    CertifiedOutputLayer,
    DenseOutputLayer,
    QuantizedOutputLayer,
)
from speculative_complete.decoding.forward.shapes import gguf_family, gguf_shape

# The parts ``assembly`` asks for, as a GGUF names layer i's tensors (``blk.{i}.NAME.weight``).
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


class GgufWeights:
    """A GGUF file's tensors, memory-mapped, as the lean forward's parts: products on the
    native kernels over the file's own blocks where they multiply every part (else torch's, over
    the blocks' 4-bit terms), norms, biases. Rows of q and k (and their biases and norms) kept in
    rotate-half order (``halves``) are permuted into adjacent pairs."""

    def __init__(self, path: str, dense: bool, kernels: bool = True) -> None:
        """``dense``: weights as fp32 values; ``kernels``: False keeps the native kernels unloaded
        (the weights go to another device)."""
        header = read_header(path)
        self.shape, self.index = gguf_shape(header), header.tensors
        self.halves = gguf_family(header).gguf_rotate_half  # q and k rows in rotate-half order
        self.token_types = header.fields.get("tokenizer.ggml.token_type")
        with open(path, "rb") as file:
            self.mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = np.frombuffer(self.mapping, dtype=np.uint8)
        self.dense = dense
        native = kernels and not dense
        self.native = kernels_for_files() if native else None
        self.pairs, self.pairs_in_head = pair_orders(self.shape), rope_order(self.shape.head_dim, 1)
        self.torch_linear = torch_linear(self.weight)

    def special_tokens(self) -> list[int]:
        """The ids the vocabulary marks control or user-defined: its special tokens."""
        if self.token_types is None:
            return []
        kinds = (TokenType.CONTROL, TokenType.USER_DEFINED)
        return np.flatnonzero(np.isin(self.token_types, kinds)).tolist()

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


def from_gguf(path: str, dense: bool = False, draft: bool = False) -> LlamaForward:
    """The model in a GGUF file, its quantized blocks kept as they are where a kernel takes them;
    ``dense``: every weight dequantized to fp32 instead (exact), for
    ``speculative_complete/decoding/forward/graphed.py``; ``draft``: a draft model's, whose
    output layer on the native kernels is approximate, its common and special tokens only
    (``DraftOutputLayer``)."""
    file = GgufWeights(path, dense)
    # The output layer: certified exact greedy choices (``CertifiedOutputLayer``) on the native kernels
    # or the 4-bit kernel where its type allows, else dense fp32 (exact for every type). Tied
    # embeddings are looked up in the same table.
    tied = "output.weight" not in file.index
    output = file.blocks("token_embd.weight" if tied else "output.weight")
    head = _output_layer(file.native, output, dense, file.special_tokens() if draft else None)
    if not tied and isinstance(head, (NativeOutputLayer, DraftOutputLayer)) and head.packed:
        file.release("output.weight")  # the products read the packed rows, candidates a few of the file's
    if not tied:  # looked up in the file's own blocks: no fp32 copy of a large table
        table = file.blocks("token_embd.weight")
        embed: Embedding = BlockEmbedding(table.blocks, file.index["token_embd.weight"].kind, table.width)
        if file.native is not None and file.native.supports(table.kind):
            embed = functools.partial(file.native.rows, table.kind, table.blocks, width=table.width)
    else:
        rows = isinstance(head, (CertifiedOutputLayer, DraftOutputLayer))
        embed = head.rows if rows else DenseEmbedding(head.weight)
    forward = assemble(file.shape, file.linear, file.vector, embed, head, file.optional, file.native)
    forward.formats = "+".join(sorted({t.kind.name for t in file.index.values()}))
    return forward


def with_draft_ends(forward: LlamaForward, ends: Collection[int]) -> None:
    """A draft's output layer (``from_gguf(draft=True)``) computes the rows of ``ends``, the
    model's ends of generation, too: a draft may then propose the end of the text."""
    if isinstance(forward.output_layer, DraftOutputLayer):
        forward.output_layer.include(ends)


def _output_layer(
    native: Kernels | None, weight: Weight, dense: bool, draft_special: list[int] | None
) -> torch.nn.Module:
    """The output layer for ``weight``: a draft's (``draft_special``: its special tokens, not
    None) on the native kernels wherever they take its type; else on them where the bound can be
    told, else on the 4-bit kernel where the type has 4-bit terms, else dense fp32."""
    if draft_special is not None and native is not None and native.supports(weight.kind):
        return DraftOutputLayer(native, weight, DRAFT_ROWS, draft_special)
    if native is not None and NativeOutputLayer.fits(native, weight):
        return NativeOutputLayer(native, weight)
    tensor = decode_tensor(
        weight.blocks, GGMLQuantizationType(weight.kind), (weight.out_features, weight.width)
    )
    if not dense and tensor.terms is not None and tensor.shape[0] % INT4_N_MULTIPLE == 0:
        return QuantizedOutputLayer(tensor)
    return DenseOutputLayer(torch.from_numpy(tensor.dense()))
