"""Prefill passes sized by measured time, so that a cancel waits for at most about one short pass.

The engine checks for a cancel (a newer keystroke, a spent budget, a request pre-empting idle
work) only between target passes, so the longest pass is the longest a user can be kept waiting
behind stale work. A fixed token count per prefill pass makes that wait scale with the CPU's
slowness: a count that takes a fraction of a second on one machine takes seconds on another. Here
each pass's size comes from the time per prompt token measured on the passes before it, so that a
pass takes about ``PREFILL_PASS_MS`` wherever it runs.

Smaller passes cost throughput: every pass pays a fixed part (the per-operation overhead and the
weights read once per pass) that a long pass spreads over more tokens. ``MIN_PREFILL_TOKENS``
bounds that cost where even a short pass takes longer than the target (a slow CPU then waits for
a pass of that many tokens, no more).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from decoding.drafters.length import ema

# How long one prefill pass should take: the longest a cancel then waits for the pass in flight.
PREFILL_PASS_MS = 50.0
# The fewest prompt tokens per pass: below this a pass is mostly fixed cost, and a remainder
# under it joins the pass before it (which also keeps a draft riding on a real prefill pass).
MIN_PREFILL_TOKENS = 16
# How much a pass that ran faster than expected moves the estimate; a slower one is taken at once,
# since the machine getting busier is what a short cancel latency must survive.
SPEEDUP_SMOOTHING = 0.3


@dataclass
class PrefillPace:
    """The measured time per prompt token of prefill passes, and the pass size it implies.

    Before any pass is timed (a cold engine) a pass gets ``min_tokens``: the safe guess for a
    machine not yet measured. Passes shorter than ``min_tokens`` are not recorded: their time is
    mostly the fixed part, and counting it per token would shrink every later pass for nothing.
    ``clock`` is a parameter so that tests can run a slow machine deterministically.
    """

    min_tokens: int = MIN_PREFILL_TOKENS
    token_ms: float | None = None  # per prompt token, over passes of at least ``min_tokens``
    clock: Callable[[], float] = field(default=time.perf_counter)

    def tokens(self, target_ms: float, most: int) -> int:
        """Prompt tokens for the next pass: as many as fit in ``target_ms``, at least
        ``min_tokens`` and at most ``most``."""
        if self.token_ms is None or self.token_ms <= 0:
            fitting = self.min_tokens
        else:
            fitting = int(target_ms / self.token_ms + 1e-6)  # 50 / 2.0 is 25, not 24.999...
        return max(1, min(most, max(self.min_tokens, fitting)))

    def record(self, tokens: int, ms: float) -> None:
        """A prefill pass over ``tokens`` took ``ms``."""
        if tokens < max(1, self.min_tokens):
            return
        per_token = ms / tokens
        if self.token_ms is None or per_token >= self.token_ms:
            self.token_ms = per_token
        else:
            self.token_ms = ema(self.token_ms, per_token, SPEEDUP_SMOOTHING)
