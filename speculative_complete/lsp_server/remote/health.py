"""Outage and recovery of an endpoint, as data: one notice when it goes down, one when it is back.

Every keystroke makes a request, so without this an engine that is down would cost a connection
attempt (and possibly a timeout) per keystroke and a message per keystroke. Instead: the first
hard failure (refused, DNS, 5xx, an auth error, a malformed answer) or ``SOFT_FAILURES_FOR_OUTAGE``
timeouts in a row mark the endpoint down; while down, requests are answered at once without
touching the network, except one probe each time the backoff (doubling, capped) runs out; the
first success marks it up again. Thread-safe: the worker thread reports, the event loop reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Status = Literal["unknown", "up", "down"]
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
SOFT_FAILURES_FOR_OUTAGE = 3  # timeouts can be one slow prefill: only a run of them is an outage


@dataclass(frozen=True)
class Notice:
    """Something worth one ``window/showMessage``: ``kind`` "down" (a warning) or "recovered"."""

    kind: Literal["down", "recovered"]
    message: str
    at: float  # time.time()


class Health:
    def __init__(
        self,
        describe: str,
        on_notice: Callable[[Notice], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.describe = describe  # the endpoint as shown to the user (no secrets in it)
        self.status: Status = "unknown"
        self.backoff_s = 0.0
        self.retry_at = 0.0
        self.soft_failures = 0
        self.outages = 0
        self._clock = clock
        self._on_notice = on_notice
        self._notices: deque[Notice] = deque(maxlen=16)
        self._lock = threading.Lock()

    def admit(self) -> str | None:
        """None: go ahead. Else why not (down and backing off). Admitting a probe moves the next
        retry on, so that concurrent requests don't all probe at once."""
        with self._lock:
            if self.status != "down":
                return None
            now = self._clock()
            if now >= self.retry_at:
                self.retry_at = now + self.backoff_s
                return None
            return f"{self.describe} is unreachable; next try in {self.retry_at - now:.1f} s"

    def success(self) -> None:
        with self._lock:
            recovered = self.status == "down"
            self.status, self.soft_failures, self.backoff_s = "up", 0, 0.0
            notice = (
                self._notice("recovered", f"{self.describe} answers again; completions are back")
                if recovered
                else None
            )
        self._tell(notice)

    def failure(self, error: str, hard: bool = True) -> None:
        """A request failed for a reason on the engine's side (not a cancel, not our budget)."""
        notice = None
        with self._lock:
            self.soft_failures = 0 if hard else self.soft_failures + 1
            if not hard and self.soft_failures < SOFT_FAILURES_FOR_OUTAGE and self.status != "down":
                return
            now = self._clock()
            if self.status != "down":
                self.status, self.backoff_s = "down", FIRST_BACKOFF_S
                self.outages += 1
                notice = self._notice(
                    "down",
                    f"{self.describe} is unreachable ({error}); completions are empty "
                    "until it answers again (retrying with backoff)",
                )
            else:
                self.backoff_s = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, self.backoff_s * 2))
            self.retry_at = now + self.backoff_s
        self._tell(notice)

    def take_notices(self) -> list[Notice]:
        """The notices since the last call, oldest first (for the server to show)."""
        with self._lock:
            out = list(self._notices)
            self._notices.clear()
            return out

    def _notice(self, kind: Literal["down", "recovered"], message: str) -> Notice:
        notice = Notice(kind, message, time.time())
        self._notices.append(notice)
        return notice

    def _tell(self, notice: Notice | None) -> None:
        """The callback runs outside the lock: it may well ask for the status."""
        if notice is not None and self._on_notice is not None:
            self._on_notice(notice)
