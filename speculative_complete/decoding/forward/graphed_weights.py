"""The graphed forward's weights on its device: dense in one dtype, or a GGUF's 4-bit blocks as they are.

Why 4-bit on a GPU: a decode step reads every weight once, so its time is the weights' bytes over
the memory's bandwidth; a 7B model is 15 GB in bf16, more than most cards people code on hold.
torch's ``_weight_int4pack_mm`` (the kernel gpt-fast's int4 path uses) multiplies bf16 rows by
4-bit weights with one bf16 scale and zero per group of 32 values: ``(q - 8) * scale + zero``,
which is exactly how ``Int4Term`` holds a Q4_0, Q4_1 or Q4_K block (``quant/gguf_blocks.py``, the
CPU path's mapping). Those tensors go to the device as their blocks' nibbles, scales rounded to
bf16 (the kernel's own width, as the CPU path's kernel does). Every other type (Q5, Q6_K, Q8_0,
F16) is dense in the forward's dtype: its 4-bit form is two terms, or one padded to twice the
width, and would read as many bytes as bf16 does.

Batch invariance is the forward's (``graphed.py``): every pass of the target feeds one width, so
each product runs one kernel on one shape. On the CPU the same products run on the CPU's variant
of the kernel (``_weight_int4pack_mm_for_cpu``, another packing of the same nibbles, same scales),
so the tests there exercise this mapping where no GPU is present.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from speculative_complete.decoding.forward.quant.gguf_blocks import GROUP, Int4Term, QuantTensor

log = logging.getLogger(__name__)

N_MULTIPLE = 8  # the CUDA kernel tiles output rows by 8 (the CPU one by 16)


class DenseProduct:
    """``x @ W.T`` with ``W`` dense on the device, in the forward's dtype."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)

    def nbytes(self) -> int:
        return self.weight.nbytes


class Int4Product:
    """``x @ W.T`` with ``W`` in 4-bit groups of 32 (``Int4Term``'s form), bf16 in and out."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """``q``: (out, in) uint8 values 0..15 on the device; ``scale``, ``zero``: (out, in / 32)."""
        out_features, in_features = q.shape
        self.out_features, self.in_features = out_features, in_features
        self.device = q.device
        # (groups, out, 2): each group's scale and zero side by side, as both kernels read them
        self.scales = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        if self.device.type == "cuda":
            # two values a byte, the first in the high nibble: the layout the CUDA packer takes
            nibbles = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            self.packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, inner_k_tiles(in_features))
        else:
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)

    @classmethod
    def from_term(cls, term: Int4Term, device: torch.device) -> Int4Product:
        def put(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(device)

        return cls(put(term.q), put(term.scale), put(term.zero))

    @staticmethod
    def fits(tensor: QuantTensor, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether ``tensor`` goes to ``device`` as its own 4-bit blocks: one unpadded term, a
        shape the kernel tiles, bf16 activations (the kernel's only input type)."""
        if dtype != torch.bfloat16 or tensor.terms is None or len(tensor.terms) != 1:
            return False
        out_features, in_features = tensor.shape
        rows = N_MULTIPLE if device.type == "cuda" else 16
        return (
            not tensor.terms[0].padded
            and out_features % rows == 0
            and in_features % GROUP == 0
            and (device.type != "cuda" or inner_k_tiles(in_features) > 0)
            and int4_kernel_works(device)
        )

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.device.type == "cuda":
            out = torch.ops.aten._weight_int4pack_mm(x, self.packed, GROUP, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales)
        return out if bias is None else out + bias

    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


@functools.cache
def int4_kernel_works(device: torch.device) -> bool:
    """Whether this device's 4-bit kernel packs and multiplies as the weights' values say (CUDA's
    needs compute capability 8.0 or newer), checked once per device on a small product. Where it
    does not, every weight stays dense, and the log says why."""
    rng = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (64, 128), generator=rng, dtype=torch.uint8)
    scale, zero = torch.rand(64, 4, generator=rng) / 10, torch.rand(64, 4, generator=rng) / 10
    x = torch.randn(16, 128, generator=rng).bfloat16()
    try:
        got = Int4Product(q.to(device), scale.to(device), zero.to(device))(x.to(device)).float().cpu()
    except RuntimeError as exc:
        log.warning("4-bit weights are not available on %s (%s); weights stay dense", device, exc)
        return False
    bf16 = scale.bfloat16().float()[..., None], zero.bfloat16().float()[..., None]
    weights = ((q.float() - 8).view(64, 4, GROUP) * bf16[0] + bf16[1]).view(64, 128)
    want = x.float() @ weights.T
    works = torch.allclose(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    if not works:
        log.warning("the 4-bit kernel on %s does not multiply as expected; weights stay dense", device)
    return works


def inner_k_tiles(in_features: int) -> int:
    """The CUDA packer's tiles along the input (8, 4 or 2 of 16 values), the most that divide
    ``in_features``; 0 where none does (then the weight stays dense)."""
    return next((tiles for tiles in (8, 4, 2) if in_features % (tiles * 16) == 0), 0)


Product = DenseProduct | Int4Product


def device_product(tensor: QuantTensor, device: torch.device, dtype: torch.dtype) -> Product:
    """``tensor`` on ``device``: its 4-bit blocks where they fit the kernel, else dense in ``dtype``."""
    if Int4Product.fits(tensor, device, dtype):
        assert tensor.terms is not None
        return Int4Product.from_term(tensor.terms[0], device)
    return DenseProduct(torch.from_numpy(tensor.dense()).to(device, dtype).contiguous())


@dataclass
class GraphedLayer:
    attn_norm: torch.Tensor
    qkv: Product  # rotary pairs adjacent as in ``LlamaForward``
    out: Product
    ffn_norm: torch.Tensor
    gate_up: Product
    down: Product
    qkv_bias: torch.Tensor | None = None  # as in ``LlamaLayer``
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


Rows = Callable[[torch.Tensor], torch.Tensor]  # token ids -> (rows, dim), wherever they are kept


@dataclass
class GraphedWeights:
    """What a ``GraphedForward`` multiplies, already on its device (norms in its dtype).

    ``embed`` and ``output_rows`` may look rows up anywhere (a dense table on the device, or a
    GGUF's blocks on the host, which keeps a large table off the GPU); the forward copies each
    pass's embedded rows into its input buffer."""

    layers: list[GraphedLayer]
    final_norm: torch.Tensor
    output: Product
    embed: Rows
    output_rows: Rows
    fingerprint: str  # which target a draft head was trained for (``LlamaForward.fingerprint``)
    formats: str  # where the weights came from, e.g. "F32+Q4_1+Q8_0"

    def nbytes(self) -> int:
        """Bytes of weights on the device."""
        total = self.final_norm.nbytes + self.output.nbytes()
        for layer in self.layers:
            total += layer.attn_norm.nbytes + layer.ffn_norm.nbytes
            total += sum(p.nbytes() for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
        return total


__all__ = [
    "DenseProduct",
    "GraphedLayer",
    "GraphedWeights",
    "Int4Product",
    "Product",
    "device_product",
    "inner_k_tiles",
    "int4_kernel_works",
]
