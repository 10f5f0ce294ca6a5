"""The output layer on the native kernels, its greedy choices certified exact."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.native.linear import NativeLinear
from speculative_complete.decoding.forward.native.weights import Weight
from speculative_complete.decoding.forward.quant.layers import (
    CertifiedOutputLayer,
    best_allowed,
    restricted_logits,
)

Q4_K = 12  # GGML's type number
# The output rows a draft model's steps compute (``DraftOutputLayer``): ids past it are rare.
DRAFT_ROWS = 65536


class NativeOutputLayer(CertifiedOutputLayer):
    """The output layer on the native kernels (``CertifiedOutputLayer``): every logit is their product
    of the file's blocks with the activations quantized per block, the candidates' recomputed
    in fp32 from rows ggml dequantizes. The bound: a logit differs from the exact one by at most
    its row's norm times the norm of what quantizing the activations changed (Cauchy-Schwarz),
    plus the kernels' float sums (a relative (n/32 + 8) 2^-22 of |w||x|)."""

    def __init__(self, kernels: Kernels, weight: Weight) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.out_features, weight.width
        self.norms = kernels.row_norms(weight.kind, weight.blocks, weight.width)
        self.norm_max = self.norms.max()
        # Packed rows are summed in another order (kpacked.c): within the bound above where each
        # weight is one product (Q6_K, Q5_0); Q4_K's two parts (d sc q less dmin m) round by their own
        # magnitudes, which can exceed the weight's, so its rows stay on ggml's sums.
        packs = weight.kind != Q4_K
        self.kernels, self.weight = kernels, kernels.pack(weight) if packs else weight
        self.linear = NativeLinear(kernels, [self.weight])

    @property
    def packed(self) -> bool:
        """Whether the products read a packed copy (the file's rows are then read only by id)."""
        return self.weight.packed is not None

    @staticmethod
    def fits(kernels: Kernels, weight: Weight) -> bool:
        """Whether the bound can be told for this type (not where activations are Q8_1, whose
        block sums are rounded again)."""
        probe = torch.ones(1, weight.width)
        return kernels.supports(weight.kind) and kernels.activation_error(weight.kind, probe) is not None

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.kernels.rows(self.weight.kind, self.weight.blocks, index, self.in_features)

    def _approximate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits, and each row's slack (``_slack``: both bounds need it)."""
        return self.linear(x), self._slack(x)

    def _top(self, ranking: torch.Tensor, k: int) -> Any:
        return self.kernels.top(ranking, k)

    def _slack(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, 1): the bound per unit of a row's norm."""
        error = self.kernels.activation_error(self.weight.kind, x.contiguous())
        assert error is not None  # ``fits``
        sums = (self.in_features / 32 + 8) * 2**-22 * (x.norm(dim=1) + error)
        return ((error + sums) * 1.01)[:, None]

    def _loose_bound(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.norm_max * state[:, 0] + 1e-6

    def _contenders(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        rankings: list[torch.Tensor],
        unsure: torch.Tensor,
        top: torch.Tensor,
        exact: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The base class's contenders, each token's bound its row's norm times the row's slack,
        plus 1e-6: one C pass a row and ranking, where torch made a dozen passes over the
        vocabulary (at every step the loose bound leaves unsure: most steps of a random prompt)."""
        slack = state[unsure, 0].tolist()
        bests = [best.tolist() for best in best_allowed(rankings, unsure, top, exact)]
        rows, ids = [], []
        for i, row in enumerate(unsure.tolist()):
            found: set[int] = set()
            for ranking, best in zip(rankings, bests, strict=True):
                found.update(self.kernels.contenders(ranking[row], self.norms, slack[i], best[i]).tolist())
            outside = sorted(found.difference(top[row].tolist()))  # a few dozen ids
            rows += [row] * len(outside)
            ids += outside
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)

    def nbytes(self) -> int:
        return self.linear.nbytes() + self.norms.nbytes


class DraftOutputLayer(torch.nn.Module):
    """A draft model's output layer: the native product of its first ``rows`` rows and of its
    ``special`` tokens past them, approximate.

    A draft model's tokens are proposals the target verifies, so nothing it writes depends on
    its exact logits: ``NativeOutputLayer``'s exact candidates and bounds are left out, and so
    are the rare tokens. BPE ids come in merge order, so the tokens past ``DRAFT_ROWS`` are rare
    ones (words of other languages for a code model), save the special tokens a vocabulary adds
    at its end (``<|endoftext|>``: a draft must be able to end the text), which are kept. The
    logits are ``out_features`` wide (up to the last kept id), -inf where a row is not computed; the drafter
    gives the ids past them probability 0 (``ModelDrafter._fit``). A draft step then reads less
    than half a Qwen2.5 output layer. Rows looked up by id (a tied embedding) read every row."""

    def __init__(self, kernels: Kernels, weight: Weight, rows: int, special: Sequence[int] = ()) -> None:
        super().__init__()
        self.in_features, self.first = weight.width, min(rows, weight.out_features)
        self.kernels, self.weight = kernels, weight
        kept = replace(weight, blocks=weight.blocks[: self.first])
        self.linear = NativeLinear(kernels, [kernels.pack(kept)])
        self.special = torch.zeros(0, dtype=torch.int64)
        self.special_linear: NativeLinear | None = None
        self.out_features = self.first
        self.include(special)

    def include(self, ids: Collection[int]) -> None:
        """Compute rows ``ids`` past the first ones as well (the loader adds the model's ends of
        generation, which a vocabulary may hold among its common tokens' ids)."""
        wanted = {int(i) for i in ids if self.first <= i < self.weight.out_features}
        wanted |= set(self.special.tolist())
        if not wanted:
            return
        self.special = torch.tensor(sorted(wanted), dtype=torch.int64)
        self.out_features = int(self.special[-1]) + 1
        picked = replace(self.weight, blocks=np.ascontiguousarray(self.weight.blocks[self.special.numpy()]))
        self.special_linear = NativeLinear(self.kernels, [picked])

    @property
    def packed(self) -> bool:
        """Whether the products read a packed copy (the file's rows are then read only by id)."""
        return self.linear.weights[0].packed is not None

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.kernels.rows(self.weight.kind, self.weight.blocks, index, self.in_features)

    def forward(
        self, x: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None = None, greedy_only: bool = False
    ) -> torch.Tensor:
        """Logits (rows, ``out_features``), each row's tokens outside its ``allowed`` (rows past its end,
        or None: all allowed) at -inf; ``greedy_only`` changes nothing (nothing here is
        certified)."""
        logits = self.linear(x)
        if self.special_linear is not None:
            common = logits
            logits = torch.full((x.shape[0], self.out_features), float("-inf"))
            logits[:, : self.first] = common
            logits[:, self.special] = self.special_linear(x)
        if allowed is None:
            return logits
        return restricted_logits(
            logits, [None if ids is None else ids[ids < self.out_features] for ids in allowed]
        )

    def nbytes(self) -> int:
        nbytes = self.linear.nbytes()
        return nbytes + (self.special_linear.nbytes() if self.special_linear is not None else 0)
