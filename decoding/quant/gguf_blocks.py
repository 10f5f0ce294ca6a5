"""A GGUF tensor's quantized blocks, as terms a 4-bit weight-only kernel can multiply with.

torch's CPU kernel for weight-only int4 (``_weight_int4pack_mm_for_cpu``) computes with weights
``(q - 8) * scale + zero`` for 4-bit ``q`` in groups of 32 along the input dimension. Several
GGUF block types are exactly that, or a sum of two such terms, so their values reach the kernel
unchanged instead of through a dequantized fp32 copy:

- Q4_0 (``w = (q - 8) * d``): one term, ``scale = d``, ``zero = 0``.
- Q4_1 (``w = q * d + m``): one term, ``scale = d``, ``zero = m + 8d``.
- Q4_K (256-value super-blocks, eight sub-blocks of 32 with 6-bit scales and mins:
  ``w = d * sc * q - dmin * m``): one term, ``scale = d * sc``, ``zero = 8 d sc - dmin m``.
- Q8_0 (``w = q * d``, 8-bit ``q``): two terms, splitting ``q = 16 hi + lo``: ``hi + 8`` with
  ``scale = 16 d`` and ``lo`` with ``scale = d, zero = 8 d``.

Other types (Q6_K's 16-value sub-blocks, Q5_*, F16, BF16, F32, ...) have no such form at this
group size: they are decoded to dense fp32 by the gguf package (exact for every type here) and
multiplied by a dense layer.

Where rounding enters: the file's scales are fp16 and the kernel's are bf16, so each group's
scale and zero are rounded to bf16 when packed (``Int4Linear``); the activations enter each
quantized product as bf16, accumulate in fp32 and leave as bf16. The terms here keep fp32
scales; ``dense()`` reconstructs their weights for tests against ``gguf.quants.dequantize``.
No library does this mapping (transformers and the gguf package only dequantize), hence the
few numpy lines per type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import quants

GROUP = 32  # the kernel's smallest group, and the block size of every type mapped here


@dataclass
class Int4Term:
    """``w[n, k] = (q[n, k] - 8) * scale[n, k // GROUP] + zero[n, k // GROUP]``."""

    q: np.ndarray  # (out, in) uint8 in 0..15
    scale: np.ndarray  # (out, in // GROUP) float32
    zero: np.ndarray  # (out, in // GROUP) float32

    def dense(self) -> np.ndarray:
        scale = np.repeat(self.scale, GROUP, axis=1)
        zero = np.repeat(self.zero, GROUP, axis=1)
        return (self.q.astype(np.float32) - 8) * scale + zero


@dataclass
class QuantTensor:
    """A 2-D weight (out, in): a sum of 4-bit terms, or dense values when the type has no such form."""

    shape: tuple[int, int]
    kind: str  # the GGUF type's name
    terms: list[Int4Term] | None = None
    values: np.ndarray | None = None  # (out, in) float32 when ``terms`` is None

    def dense(self) -> np.ndarray:
        if self.terms is None:
            assert self.values is not None
            return self.values
        return sum(term.dense() for term in self.terms)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """Two bytes per row, read as the fp16 they hold, widened to fp32 (exact)."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes of a 32-value block: low nibbles are values 0-15, high nibbles 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray) -> list[Int4Term]:
    d = _fp16(blocks[:, 0:2])
    return [Int4Term(_nibbles(blocks[:, 2:18]), d, np.zeros_like(d))]


def _q4_1(blocks: np.ndarray) -> list[Int4Term]:
    d, m = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    return [Int4Term(_nibbles(blocks[:, 4:20]), d, m + 8 * d)]


def _q8_0(blocks: np.ndarray) -> list[Int4Term]:
    d = _fp16(blocks[:, 0:2])
    q = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8).astype(np.int16)
    hi, lo = q >> 4, q & 0x0F  # q = 16 * hi + lo, hi in -8..7, lo in 0..15
    return [
        Int4Term((hi + 8).astype(np.uint8), 16 * d, np.zeros_like(d)),
        Int4Term(lo.astype(np.uint8), d, 8 * d),
    ]


def _q4_k(blocks: np.ndarray) -> list[Int4Term]:
    n = blocks.shape[0]
    d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    sc, m = quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
    scale = d * sc.astype(np.float32)  # (n, 8), one per sub-block of 32
    minimum = dmin * m.astype(np.float32)
    # 128 bytes: four chunks of 32 bytes; low nibbles are sub-block 2j, high nibbles 2j + 1.
    qs = blocks[:, 16:144].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32)
    return [Int4Term(q.reshape(n * 8, 32), scale.reshape(-1, 1), (8 * scale - minimum).reshape(-1, 1))]


# type -> (values per block, bytes per block, decoder of (blocks, bytes) rows into terms)
_DECODERS = {
    QType.Q4_0: (32, 18, _q4_0),
    QType.Q4_1: (32, 20, _q4_1),
    QType.Q8_0: (32, 34, _q8_0),
    QType.Q4_K: (256, 144, _q4_k),
}


def supports_int4(kind: QType) -> bool:
    return kind in _DECODERS


def decode_tensor(raw: np.ndarray, kind: QType, shape: tuple[int, int]) -> QuantTensor:
    """The (out, in) weight held in ``raw``, the tensor's bytes as the GGUF stores them."""
    out_features, in_features = shape
    entry = _DECODERS.get(kind)
    if entry is None or in_features % entry[0]:
        values = quants.dequantize(np.asarray(raw), kind).reshape(shape).astype(np.float32, copy=False)
        return QuantTensor(shape, kind.name, values=values)
    _, nbytes, decoder = entry
    blocks = np.asarray(raw).reshape(-1, nbytes)
    terms = []
    for term in decoder(blocks):
        groups = in_features // GROUP
        terms.append(
            Int4Term(
                term.q.reshape(out_features, in_features),
                term.scale.reshape(out_features, groups),
                term.zero.reshape(out_features, groups),
            )
        )
    return QuantTensor(shape, kind.name, terms=terms)


def quantize_dense(weight: np.ndarray, bits: int) -> QuantTensor:
    """Quantize an fp32 (out, in) weight at load, for safetensors models: ``bits`` 4 as Q4_1
    blocks (min/max per 32), 8 as Q8_0 blocks (absmax per 32), with the gguf package's own
    quantizers, so the result is what a GGUF of that type would hold."""
    kind = QType.Q4_1 if bits == 4 else QType.Q8_0
    raw = quants.quantize(np.ascontiguousarray(weight, dtype=np.float32), kind)
    return decode_tensor(raw, kind, weight.shape)
