"""A linear layer over weights in a GGUF's own blocks, multiplied on the native kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.native.weights import Weight, WeightGroup


class NativeLinear(torch.nn.Module):
    """``x @ W.T`` for weights in a GGUF's own blocks (memory-mapped, never copied), on the
    native kernels; several weights side by side (q, k and v) fill one output, each in its type.
    ``order`` permutes the output's columns (q's and k's rotate-half rows taken to adjacent
    pairs): the same values as the permuted rows' product, as each output is its row's alone,
    without a copy of the rows beside the file's (which stay mapped, and resident once read)."""

    def __init__(
        self, kernels: Kernels, weights: Sequence[Weight], order: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.kernels, self.weights, self.order = kernels, list(weights), order
        self.in_features = self.weights[0].width
        self.out_features = sum(w.out_features for w in self.weights)
        self.group = WeightGroup(self.weights)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T``, plus ``residual`` (rows, out) where given, in the same call."""
        x = x.float().contiguous()
        out = torch.empty(x.shape[0], self.out_features)
        if residual is not None:
            assert self.order is None  # the sum is of the product's own columns
            residual = residual.contiguous()
        self.kernels.products(self.group, x, out, residual)
        return out if self.order is None else out[:, self.order]

    # Called as a function, without ``Module.__call__``'s hook handling: a decode step makes
    # four of these calls a layer, and nothing hooks them.
    __call__ = forward

    def nbytes(self) -> int:
        return sum(w.blocks.nbytes if w.packed is None else w.packed.nbytes for w in self.weights)
