"""What a target pass costs, in single-token steps: a prior table per device, replaced by
live measurements as passes are timed.

The engine times its passes into a ``CostModel`` and the drafters price their drafts with one
(``speculative_complete.decoding.drafters.length``: how long a draft should be). On the 2-core CPU the cost
is far from flat (2 or 4 tokens cost about one step, 8 tokens 1.6, 9 and more 2), so the costs
are measured while serving rather than assumed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

# Relative cost of one target pass over n tokens, measured with SmolLM2-135M fp32 on the 2-core
# CPU with the small-batch layers of ``cpu_matmul.py`` (the passes of 64 tokens and more, timed
# with one logits row, price the drafts that ride on a prefill); replaced by live measurements as
# passes are timed.
CPU_PRIOR = {
    1: 1.0,
    2: 1.05,
    3: 1.25,
    4: 1.1,
    5: 1.3,
    6: 1.5,
    8: 1.57,
    9: 1.8,
    10: 2.15,
    16: 2.25,
    24: 2.45,
    32: 2.8,
    64: 3.8,
    128: 5.6,
    256: 9.1,
    512: 18.6,
}
ACCELERATOR_PRIOR = {1: 1.0, 8: 1.05, 16: 1.1, 32: 1.25}
# A draft riding on a prefill pass of at least this many tokens is priced by the rows it adds.
RIDING_MIN_TOKENS = 16
# A pass timed slower than this many times its price counts as if it had taken that long.
SLOWEST_SAMPLE = 1.5


def _interpolate(table: dict[int, float], n: int) -> float:
    if n in table:
        return table[n]
    keys = sorted(table)
    if n <= keys[0]:
        return table[keys[0]]
    if n >= keys[-1]:
        return table[keys[-1]] * n / keys[-1]
    lo = max(k for k in keys if k < n)
    hi = min(k for k in keys if k > n)
    return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)


def ema(old: float | None, new: float, weight: float = 0.2) -> float:
    """An exponential moving average: ``new`` itself when there is no ``old`` yet."""
    return new if old is None else old + weight * (new - old)


def timed_ema(old: float | None, ms: float, weight: float = 0.2) -> float:
    """``ema`` of a time, a sample past ``SLOWEST_SAMPLE`` times ``old`` counted as that. On a
    shared machine a pass now and then takes several times its usual time (another tenant had
    the cores or the memory bus); one such sample would move a price far, and a price set too high
    can stay so for good (``CostModel.record``). A lasting slow-down still moves it, a few
    samples later."""
    return ema(old, ms if old is None else min(ms, old * SLOWEST_SAMPLE), weight)


@dataclass
class CostModel:
    """Milliseconds per target pass by number of tokens fed, as an exponential moving average."""

    prior: dict[int, float] = field(default_factory=lambda: dict(CPU_PRIOR))
    smoothing: float = 0.2
    measured_ms: dict[int, float] = field(default_factory=dict)
    riding_on: int = 0  # tokens of the prefill pass a draft would ride on (0: a decode step)

    @classmethod
    def for_device(cls, device_type: str, prior: dict[int, float] | None = None) -> CostModel:
        """The device's default prior, or the pass's own (``ModelPass.cost_prior``) when it has one."""
        if prior is None:
            prior = CPU_PRIOR if device_type == "cpu" else ACCELERATOR_PRIOR
        return cls(prior=dict(prior))

    def record(self, n_tokens: int, ms: float) -> None:
        """A pass timed (``timed_ema``): a wider pass's first time moves its price from where
        ``relative`` put it, not to it. Set or raised far by one slow pass on a busy machine, a
        width's price could stay too high for good: a width priced too high is no longer
        drafted, so never timed again."""
        old = self.measured_ms.get(n_tokens)
        if old is None and n_tokens > 1 and self.step_ms:
            old = self.relative(n_tokens) * self.step_ms
        self.measured_ms[n_tokens] = timed_ema(old, ms, self.smoothing)

    @property
    def step_ms(self) -> float | None:
        return self.measured_ms.get(1)

    def relative(self, n_tokens: int) -> float:
        """Cost of a pass over ``n_tokens`` in single-token steps (1.0 for one token): as timed;
        else the prior, or the line between the nearest timed widths around it where that is
        cheaper. A width priced too high is not drafted, so never timed, and its price would
        never be corrected (a 135M model's prior priced five rows at 1.5 times a 1.5B's timed cost);
        one priced too low is drafted, timed, and corrected."""
        one = self.measured_ms.get(1)
        if not one:
            return _interpolate(self.prior, n_tokens)
        here = self.measured_ms.get(n_tokens)
        if here:
            return here / one
        prior = _interpolate(self.prior, n_tokens)
        below = [n for n in self.measured_ms if n < n_tokens]
        above = [n for n in self.measured_ms if n > n_tokens]
        if not below or not above:
            return prior
        timed = {n: self.measured_ms[n] / one for n in (max(below), min(above))}
        return min(prior, _interpolate(timed, n_tokens))

    def added_row(self, drafted: int) -> float:
        """What one more drafted token adds to the pass that verifies ``drafted`` others, in
        single-token steps (with none drafted: the pass that would have run anyway is a step)."""
        return self.verify(drafted + 1) - (self.verify(drafted) if drafted else 1.0)

    def verify(self, k: int) -> float:
        """Cost of the pass that verifies ``k`` drafted tokens, in single-token steps.

        In decoding that is a pass over k+1 tokens. A draft riding on a prefill pass of n tokens
        costs only the rows it adds to a pass that runs anyway (on the CPU a few hundredths of a
        step each), so there even a weak draft is worth sending: it is priced as one step plus
        that difference, from the prior table (a long pass is rarely timed at the same length).
        """
        n = self.riding_on
        if n < RIDING_MIN_TOKENS:
            return self.relative(k + 1)
        return 1.0 + max(0.0, _interpolate(self.prior, n + k) - _interpolate(self.prior, n))

    @contextlib.contextmanager
    def riding(self, prefill_tokens: int) -> Iterator[None]:
        """Price drafts proposed inside this block as riding on a prefill pass of that length."""
        saved, self.riding_on = self.riding_on, prefill_tokens
        try:
            yield
        finally:
            self.riding_on = saved
