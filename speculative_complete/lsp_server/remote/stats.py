"""The ``endpoint`` block of ``lsp_server/stats``: counters and engine latencies, without secrets.

Updated from the worker thread, read from the event loop: guarded by a lock. Latencies are the
engine's as the client sees them (request sent -> first / last streamed text), so they include
the network and the engine's queue, which is what a remote setup should be judged by.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from speculative_complete.lsp_server.stats import LATENCY_WINDOW, percentile


@dataclass
class EndpointStats:
    requests: int = 0  # completions asked of the engine (backed-off ones included)
    errors: int = 0  # of those, failed (backed-off ones included)
    backed_off: int = 0  # answered empty at once while the endpoint was down
    cancelled: int = 0  # streams closed early because the caller stopped them
    budget: int = 0  # streams closed because the deadline passed
    tokens: int = 0  # tokens received
    fim_unsupported: bool = False  # the engine refused a suffix; prompts go without it
    tokenize_requests: int = 0
    tokenize_failed: int = 0
    tokenize_supported: bool | None = None  # None: not asked yet
    last_error: str | None = None
    ttft_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    ttlt_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, **changes: Any) -> None:
        """Adds to counters (ints), appends latencies, replaces the rest; under the lock."""
        with self._lock:
            for name, value in changes.items():
                current = getattr(self, name)
                if isinstance(current, deque):
                    if value is not None:
                        current.append(value)
                elif isinstance(current, int) and not isinstance(current, bool):
                    setattr(self, name, current + value)
                else:
                    setattr(self, name, value)

    def snapshot(self, url: str, api: str, status: str, outages: int) -> dict[str, Any]:
        with self._lock:
            first, last = list(self.ttft_ms), list(self.ttlt_ms)
            return {
                "url": url,
                "api": api,
                "status": status,
                "outages": outages,
                "last_error": self.last_error,
                "requests": self.requests,
                "errors": self.errors,
                "backed_off": self.backed_off,
                "cancelled": self.cancelled,
                "budget": self.budget,
                "tokens": self.tokens,
                "fim_unsupported": self.fim_unsupported,
                "tokenize": {
                    "requests": self.tokenize_requests,
                    "failed": self.tokenize_failed,
                    "supported": self.tokenize_supported,
                },
                "ttft_ms": {"p50": percentile(first, 50), "p95": percentile(first, 95)},
                "ttlt_ms": {"p50": percentile(last, 50), "p95": percentile(last, 95)},
            }
