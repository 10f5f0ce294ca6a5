"""Random GGUF blocks of every type the 4-bit kernel takes, for the quantized layers' tests and
the native kernels' alike."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import quants

OUT, IN = 64, 512  # two Q4_K super-blocks per row


def random_blocks(kind: QType, rng: np.random.Generator, out: int = OUT, n_in: int = IN) -> np.ndarray:
    """Raw bytes of an (out, n_in) tensor of ``kind``: quantized with the gguf package where it can,
    random bytes with sane fp16 scales where it only dequantizes (K-quants)."""
    weights = rng.standard_normal((out, n_in)).astype(np.float32)
    if kind in (QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0):
        return quants.quantize(weights, kind)
    block_size, type_size = quants.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (out * n_in // block_size, type_size), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, (raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    where = {QType.Q4_K: 0, QType.Q5_K: 0, QType.Q6_K: 208, QType.Q3_K: 108, QType.Q2_K: 80}[kind]
    raw[:, where : where + 4] = scales.reshape(-1, 4)[:, : min(4, type_size - where)]  # d (and dmin)
    return raw.reshape(out, -1)


# Every GGUF type the lean forward multiplies on the 4-bit kernel, and how many terms each takes.
INT4_KINDS = {
    QType.Q4_0: 1,
    QType.Q4_1: 1,
    QType.Q5_0: 2,
    QType.Q5_1: 2,
    QType.Q8_0: 2,
    QType.Q2_K: 1,
    QType.Q3_K: 1,
    QType.Q4_K: 1,
    QType.Q5_K: 2,
    QType.Q6_K: 2,
}
