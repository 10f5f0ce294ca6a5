"""Prefill passes sized by measured time, so that a cancel waits for at most about one short pass.

The engine checks for a cancel (a newer keystroke, a spent budget, a request pre-empting idle
work) only between target passes, so the longest pass is the longest a user can be kept waiting
behind stale work. A fixed token count per prefill pass makes that wait scale with the CPU's
slowness: a count that takes a fraction of a second on one machine takes seconds on another. Here
a pass's time is modelled as a fixed part (the per-operation overhead and the weights read once
per pass, measured on the decode steps that carry no draft) plus a part per token (measured on
passes of several tokens), and each pass gets as many tokens as fit in
``PREFILL_PASS_MS`` wherever it runs.

Smaller passes cost throughput, since each pays the fixed part again. Where the fixed part is
large (a model whose weights take a long time to read, a slow CPU), a pass gets at least enough
tokens that the fixed part is at most half of it (a prefill at most twice as slow as in one long
pass), and more, up to a fixed part of ``FIXED_SHARE``, while the pass stays within
``LONGEST_PASS_MS``: that bounds both the prefill's slowdown and the cancel's wait. The bound is
a quarter second because a 1.5B model on 2 cores reads its weights in ~50 ms a pass: at a pause
nothing cancels, and a cold prompt's prefill at twice its one-pass time (the bound of 80 ms
before) cost whole seconds a request, where a keystroke behind a stale pass waits one pass at
most, the work it waited for kept for the next prompt.
Before the fixed part is measured (the first prefill after a load) passes get at least
``COLD_PREFILL_TOKENS``, the safe guess for a machine not yet measured.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# How long one prefill pass should take: the longest a cancel then waits for the pass in flight.
PREFILL_PASS_MS = 50.0
# Where fitting ``PREFILL_PASS_MS`` would leave the fixed part more than this share of a pass,
# a pass gets more tokens (a prefill then at most 1.25 times as slow as in one long pass) ...
FIXED_SHARE = 1 / 5
# ... as long as it stays this short (a fixed part of more than half a pass is never kept).
LONGEST_PASS_MS = 250.0
# Tokens per pass until the fixed part is measured; a remainder under it joins the pass before it.
COLD_PREFILL_TOKENS = 16
# The fewest tokens of a pass that measures a token's part: passes of two or three run the kernels
# for a few rows, dearer per row (the default model on the AVX2 EPYC: one token 9.3 ms, two 15.8,
# four 19.0, eight 30.6).
FEWEST_MEASURED_TOKENS = 4
# Each estimate is the (lower) median of the last this many measurements, the fixed part's of at
# least two: one hiccup (a first step's allocations, another program's burst) does not set the
# pace, a machine getting busier does within three passes (what a short cancel latency must
# survive).
WINDOW = 5


@dataclass
class PrefillPace:
    """A pass's time as ``fixed_ms`` plus ``token_ms`` per token fed, and the pass size it implies.

    ``clock`` is a parameter so that tests can run a slow machine deterministically.
    """

    clock: Callable[[], float] = field(default=time.perf_counter)
    steps_ms: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # one-token passes
    per_token_ms: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # longer ones

    @property
    def token_ms(self) -> float | None:
        """What a token adds to a pass."""
        return statistics.median_low(self.per_token_ms) if self.per_token_ms else None

    @property
    def fixed_ms(self) -> float | None:
        """What every pass costs: a one-token pass less its token."""
        if len(self.steps_ms) < 2:
            return None
        return max(0.0, statistics.median_low(self.steps_ms) - (self.token_ms or 0.0))

    def tokens(self, target_ms: float, most: int) -> int:
        """Prompt tokens for the next pass: as many as fit in ``target_ms``, at least the floor
        (``least``), at most ``most``."""
        if self.token_ms is None or self.token_ms <= 0:
            fitting = 0
        else:
            fitting = int((target_ms - (self.fixed_ms or 0.0)) / self.token_ms + 1e-6)  # 50/2 is 25
        return max(1, min(most, max(self.least(), fitting)))

    def least(self) -> int:
        """The fewest tokens a pass is given: enough that the fixed part is at most half of it,
        and up to ``FIXED_SHARE`` of it while the pass still fits in ``LONGEST_PASS_MS``."""
        if self.fixed_ms is None or self.token_ms is None or self.token_ms <= 0:
            return COLD_PREFILL_TOKENS
        half = math.ceil(self.fixed_ms / self.token_ms - 1e-6)
        worth = math.ceil(self.fixed_ms * (1 - FIXED_SHARE) / FIXED_SHARE / self.token_ms - 1e-6)
        fitting = int((LONGEST_PASS_MS - self.fixed_ms) / self.token_ms + 1e-6)
        return max(1, half, min(worth, fitting))

    def joins(self, rest: int, whole: int) -> bool:
        """Whether a remainder of ``rest`` tokens joins the pass before it (``whole`` tokens
        together): when it is under the floor and the joined pass is not too long, so that a
        short tail does not pay the fixed part again (and a draft rides on a real pass)."""
        if rest >= self.least():
            return False
        if self.fixed_ms is None or self.token_ms is None:
            return True
        return self.fixed_ms + whole * self.token_ms <= LONGEST_PASS_MS

    def record(self, tokens: int, ms: float) -> None:
        """A pass over ``tokens`` took ``ms``: a one-token pass says what the fixed part is, one
        of at least ``FEWEST_MEASURED_TOKENS`` what a token adds to it. Before the fixed part is
        known only passes of at least ``COLD_PREFILL_TOKENS`` count, their time all taken as per
        token (an overestimate, which errs on the side of short passes)."""
        if tokens == 1:
            self.steps_ms.append(ms)
        elif tokens >= (FEWEST_MEASURED_TOKENS if self.fixed_ms is not None else COLD_PREFILL_TOKENS):
            self.per_token_ms.append(max(0.0, ms - (self.fixed_ms or 0.0)) / tokens)
