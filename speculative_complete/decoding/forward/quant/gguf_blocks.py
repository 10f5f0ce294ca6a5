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
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)  # two 4-bit values a byte
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)  # four 2-bit values a byte


@dataclass
class Int4Term:
    """``w[n, k] = (q[n, k] - 8) * scale[n, k // GROUP] + zero[n, k // GROUP]``.

    ``padded``: the term multiplies the input with 16 zeros after each 16 of its values (its k
    runs over twice the input), so that types whose scales change every 16 values (Q6_K, Q3_K,
    Q2_K) keep one scale per group of the kernel; the padding's weights meet zeros and add
    exactly nothing."""

    q: np.ndarray  # (out, in) uint8 in 0..15; (out, 2 * in) where padded
    scale: np.ndarray  # (out, groups) float32
    zero: np.ndarray  # (out, groups) float32
    padded: bool = False

    def dense(self) -> np.ndarray:
        """The weights (out, in) the term stands for, padding dropped."""
        scale = np.repeat(self.scale, GROUP, axis=1)
        zero = np.repeat(self.zero, GROUP, axis=1)
        values = (self.q.astype(np.float32) - 8) * scale + zero
        if not self.padded:
            return values
        rows = values.shape[0]
        return np.ascontiguousarray(values.reshape(rows, -1, GROUP)[:, :, : GROUP // 2].reshape(rows, -1))


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
    qs = blocks[:, 16:144].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n, 8, 32)
    return [Int4Term(q.reshape(n * 8, 32), scale.reshape(-1, 1), (8 * scale - minimum).reshape(-1, 1))]


def _bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit i of each row's little-endian ``qh`` bytes, as ``count`` values 0/1 per row."""
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 1, 8)
    return ((qh[:, :, None] >> shifts) & 1).reshape(qh.shape[0], -1)[:, :count]


def _five_bit(lo: np.ndarray, hi: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> list[Int4Term]:
    """A 5-bit ``q = lo + 16 hi`` with ``w = scale * q + zero + 8 scale`` as two terms: ``lo``,
    and ``hi`` (0 or 1) at 16 times the scale."""
    return [
        Int4Term(lo.astype(np.uint8), scale, zero),
        Int4Term((hi + 8).astype(np.uint8), 16 * scale, np.zeros_like(scale)),
    ]


def _q5_0(blocks: np.ndarray) -> list[Int4Term]:
    d = _fp16(blocks[:, 0:2])  # w = d * (q - 16)
    hi = _bits(np.ascontiguousarray(blocks[:, 2:6]), 32)
    return _five_bit(_nibbles(blocks[:, 6:22]), hi, d, -8 * d)


def _q5_1(blocks: np.ndarray) -> list[Int4Term]:
    d, m = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])  # w = d * q + m
    hi = _bits(np.ascontiguousarray(blocks[:, 4:8]), 32)
    return _five_bit(_nibbles(blocks[:, 8:24]), hi, d, m + 8 * d)


def _q5_k(blocks: np.ndarray) -> list[Int4Term]:
    n = blocks.shape[0]
    d, dmin = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    sc, m = quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
    scale, minimum = (d * sc.astype(np.float32)).reshape(-1, 1), (dmin * m.astype(np.float32)).reshape(-1, 1)
    qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    hi = (qh & 1).reshape(n * 8, 32)  # sub-block j's high bits: bit j of each of the 32 bytes
    ql = blocks[:, 48:176].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)
    lo = (ql & 0x0F).reshape(n * 8, 32)
    return _five_bit(lo, hi, scale, 8 * scale - minimum)  # w = d sc q - dmin m


def _padded(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> Int4Term:
    """A term over sub-blocks of 16 values (rows of ``q``), each padded to a group of 32."""
    filler = np.full_like(q, 8)
    return Int4Term(np.concatenate([q, filler], axis=1).astype(np.uint8), scale, zero, padded=True)


def _q6_k(blocks: np.ndarray) -> list[Int4Term]:
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 1, 64) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)
    lo, hi = (ql & 0x0F).reshape(n * 16, 16), (qh & 0x03).reshape(n * 16, 16)
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    scale = (_fp16(blocks[:, 208:210]) * scales).reshape(-1, 1)  # w = d sc (lo + 16 hi - 32)
    return [_padded(lo, scale, -24 * scale), _padded(hi + 8, 16 * scale, np.zeros_like(scale))]


def _q3_k(blocks: np.ndarray) -> list[Int4Term]:
    n = blocks.shape[0]
    hmask, qs = blocks[:, 0:32], blocks[:, 32:96]
    low = np.ascontiguousarray(blocks[:, 96:104]).reshape(n, 1, 8) >> np.array(
        [0, 4], dtype=np.uint8
    ).reshape(1, 2, 1)
    high = np.ascontiguousarray(blocks[:, 104:108]).reshape(n, 1, 4) >> np.array(
        [0, 2, 4, 6], dtype=np.uint8
    ).reshape(1, 4, 1)
    sc = (low.reshape(n, 16) & 0x0F) | ((high.reshape(n, 16) & 0x03) << 4)
    scale = (_fp16(blocks[:, 108:110]) * (sc.astype(np.int8) - 32).astype(np.float32)).reshape(-1, 1)
    ql = (qs.reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    qh = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = ql.reshape(n * 16, 16).astype(np.int16) + 4 * qh.reshape(n * 16, 16)  # w = d sc (q - 4)
    return [_padded(q + 4, scale, np.zeros_like(scale))]


def _q2_k(blocks: np.ndarray) -> list[Int4Term]:
    n = blocks.shape[0]
    sc = blocks[:, 0:16]
    d, dmin = _fp16(blocks[:, 80:82]), _fp16(blocks[:, 82:84])
    scale = (d * (sc & 0x0F).astype(np.float32)).reshape(-1, 1)
    minimum = (dmin * (sc >> 4).astype(np.float32)).reshape(-1, 1)
    q = (blocks[:, 16:80].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    return [_padded(q.reshape(n * 16, 16) + 8, scale, -minimum)]  # w = d sc q - dmin m


# type -> (values per block, bytes per block, decoder of (blocks, bytes) rows into terms)
_DECODERS = {
    QType.Q4_0: (32, 18, _q4_0),
    QType.Q4_1: (32, 20, _q4_1),
    QType.Q5_0: (32, 22, _q5_0),
    QType.Q5_1: (32, 24, _q5_1),
    QType.Q8_0: (32, 34, _q8_0),
    QType.Q2_K: (256, 84, _q2_k),
    QType.Q3_K: (256, 110, _q3_k),
    QType.Q4_K: (256, 144, _q4_k),
    QType.Q5_K: (256, 176, _q5_k),
    QType.Q6_K: (256, 210, _q6_k),
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
        width = in_features * (2 if term.padded else 1)
        groups = width // GROUP
        terms.append(
            Int4Term(
                term.q.reshape(out_features, width),
                term.scale.reshape(out_features, groups),
                term.zero.reshape(out_features, groups),
                term.padded,
            )
        )
    return QuantTensor(shape, kind.name, terms=terms)


def permute_rows(tensor: QuantTensor, order: np.ndarray) -> QuantTensor:
    """``tensor`` with its output rows in ``order`` (blocks run along rows: exact)."""
    if tensor.terms is None:
        assert tensor.values is not None
        return QuantTensor(tensor.shape, tensor.kind, values=np.ascontiguousarray(tensor.values[order]))
    terms = [Int4Term(t.q[order], t.scale[order], t.zero[order], t.padded) for t in tensor.terms]
    return QuantTensor(tensor.shape, tensor.kind, terms=terms)


def quantize_dense(weight: np.ndarray, bits: int) -> QuantTensor:
    """Quantize an fp32 (out, in) weight at load, for safetensors models: ``bits`` 4 as Q4_1
    blocks (min/max per 32), 8 as Q8_0 blocks (absmax per 32), with the gguf package's own
    quantizers, so the result is what a GGUF of that type would hold."""
    kind = QType.Q4_1 if bits == 4 else QType.Q8_0
    raw = quants.quantize(np.ascontiguousarray(weight, dtype=np.float32), kind)
    return decode_tensor(raw, kind, weight.shape)
