"""How long a draft should be, from acceptance feedback and the measured cost of verification.

With a per-token acceptance rate a, a draft of k tokens yields E(k) = (1 - a^(k+1)) / (1 - a)
tokens per target pass (the accepted run plus the target's own token). That pass costs c(k+1)
single-token steps, as the engine measures them (``speculative_complete.decoding.cost_model``; far
less when it rides on a prefill pass: ``CostModel.verify``), plus k draft steps at relative cost d
for a draft model. Speculating pays only where E(k) / (c(k+1) + k*d) > 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculative_complete.decoding.cost_model import CostModel


@dataclass
class AcceptanceStats:
    """Per-token acceptance rate by bucket (n-gram match length), decayed so it tracks change.

    A draft of k tokens of which a were kept shows a acceptances and, if a < k, one rejection;
    accepted / (accepted + rejections) is the maximum-likelihood per-token rate.
    """

    # Keyed by the lower bound of each bucket: a match of 5 tokens falls in bucket 4, of 40 in 32.
    priors: dict[int, float] = field(
        default_factory=lambda: {1: 0.15, 2: 0.3, 3: 0.45, 4: 0.6, 8: 0.7, 16: 0.8, 32: 0.9}
    )
    prior_weight: float = 4.0
    decay: float = 0.97
    accepted: dict[int, float] = field(default_factory=dict)
    rejected: dict[int, float] = field(default_factory=dict)

    def bucket(self, key: int) -> int:
        return max((b for b in self.priors if b <= key), default=0)

    def alpha(self, key: int = 0) -> float:
        b = self.bucket(key)
        prior = self.priors.get(b, 0.5)
        acc = self.accepted.get(b, 0.0) + prior * self.prior_weight
        rej = self.rejected.get(b, 0.0) + (1.0 - prior) * self.prior_weight
        return acc / (acc + rej)

    def update(self, key: int, accepted: int, proposed: int) -> None:
        if proposed <= 0:
            return
        b = self.bucket(key)
        self.accepted[b] = self.accepted.get(b, 0.0) * self.decay + accepted
        self.rejected[b] = self.rejected.get(b, 0.0) * self.decay + (1.0 if accepted < proposed else 0.0)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens produced per target pass with k drafted tokens of acceptance rate ``alpha``."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_draft_length(
    alpha: float, max_len: int, cost: CostModel, draft_cost: float = 0.0
) -> tuple[int, float]:
    """The draft length in 1..max_len with the best speed-up over plain decoding, and that speed-up."""
    if max_len <= 0:
        return 0, 1.0
    gains = {k: expected_tokens(alpha, k) / (cost.verify(k) + k * draft_cost) for k in range(1, max_len + 1)}
    best = max(gains, key=lambda k: (gains[k], -k))
    return best, gains[best]
