"""A weight in a GGUF's own blocks as the native products read it (``Weight``), and weights side
by side as one call takes them (``WeightGroup``).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

PACKED = 0x10000  # added to a type: the products read the rows packed (``kpacked.h``'s LSQ_PACKED)


@dataclass(frozen=True)
class Weight:
    """One weight in a GGUF's own blocks: ``blocks`` (out, bytes per row) of GGML type ``kind``;
    ``packed``: the same rows packed for the products (``Kernels.pack``), or None: the products
    read the blocks. Rows looked up one by one (embeddings, exact logits) read the blocks."""

    kind: int
    blocks: np.ndarray
    width: int  # inputs per row
    packed: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return len(self.blocks)

    @property
    def product_kind(self) -> int:
        """The type the products are told: ``kind``, marked ``PACKED`` where packed."""
        return self.kind | PACKED if self.packed is not None else self.kind

    @functools.cached_property
    def address(self) -> int:
        """Where the products read the rows (numpy's ``ctypes.data`` costs microseconds a call)."""
        return self.packed.data_ptr() if self.packed is not None else self.blocks.ctypes.data


class WeightGroup:
    """Weights side by side as ``lsq_matmul_many`` takes them: their types, addresses and row
    counts as C arrays, made once (a decode step calls it four times a layer)."""

    def __init__(self, weights: Sequence[Weight]) -> None:
        self.count = len(weights)
        self.kinds = (ctypes.c_int * self.count)(*(w.product_kind for w in weights))
        self.addresses = (ctypes.c_void_p * self.count)(*(w.address for w in weights))
        self.out_rows = (ctypes.c_int64 * self.count)(*(w.out_features for w in weights))
        self.distinct_kinds = tuple(dict.fromkeys(w.product_kind for w in weights))
