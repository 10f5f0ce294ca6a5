"""Counters behind the ``lsp_server/stats`` request; touched on the event loop thread only."""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

LATENCY_WINDOW = 2000  # the most recent answers that the percentiles describe
PHASES = ("queue", "prompt", "prefill", "draft", "verify", "decode_other", "postprocess")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no data (JSON null rather than a made-up 0)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1], 2)


def distribution(values: list[float]) -> dict[str, float | int | None]:
    """The median, the 95th percentile and the largest of ``values``, and how many there are."""
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": round(max(values), 2) if values else None,
        "count": len(values),
    }


def process_memory(pid: int | None = None) -> dict[str, float | None]:
    """Resident memory now and at its peak, in MB, of this process (what the server costs the
    machine it shares with the editor) or of process ``pid``. Read from ``/proc`` (Linux); for
    this process elsewhere only the peak is known (``getrusage``: bytes on macOS), and nothing on
    Windows. None for a process that is gone."""
    fields = {}
    try:
        with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    fields[name] = round(int(value.split()[0]) / 1024, 1)
    except OSError:
        pass
    if "VmHWM" in fields or pid is not None:
        return {"rss_mb": fields.get("VmRSS"), "peak_rss_mb": fields.get("VmHWM")}
    try:
        import resource
    except ImportError:  # Windows
        return {"rss_mb": None, "peak_rss_mb": None}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rss_mb": None, "peak_rss_mb": round(peak / (2**20 if sys.platform == "darwin" else 1024), 1)}


@dataclass
class DrafterTotals:
    proposed: int = 0
    accepted: int = 0

    def to_dict(self) -> dict[str, Any]:
        acceptance = self.accepted / self.proposed if self.proposed else None
        return {
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance": None if acceptance is None else round(acceptance, 4),
        }


@dataclass
class ServerStats:
    """Request outcomes and decoding totals since the server started.

    Every completion request ends in exactly one of: a non-empty answer, ``empty`` (which
    includes ``superseded``, ``mid_word`` and ``failed`` answers), ``cancelled`` (answered with
    RequestCancelled) or ``errors`` (an LSP error such as InvalidParams).
    """

    requests: int = 0
    answered: int = 0
    cancelled: int = 0
    superseded: int = 0
    mid_word: int = 0  # answered empty without decoding: a word character follows the cursor
    failed: int = 0
    empty: int = 0
    errors: int = 0
    budget_exhausted: int = 0
    decodes: int = 0  # decodes that ran on the worker (finished, stopped or superseded midway)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    produced_tokens: int = 0
    target_passes: int = 0
    # the same after each decode's prefill: the drafters' own figure (see GenerationStats.after_prefill)
    tokens_after_prefill: int = 0
    passes_after_prefill: int = 0
    drafters: dict[str, DrafterTotals] = field(default_factory=dict)
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    known_tokens: int = 0  # tokens answered from a document's greedy chain, without a pass
    reuse: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("repeated", "typed_ahead", "from_chain", "accepted"), 0)
    )
    prefetch: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("runs", "completed", "preempted", "tokens", "target_passes", "rests", "renewed"), 0
        )
    )
    # excerpts of other files in answered prompts, by kind (``context.snippets.Snippet.kind``)
    excerpts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("definition", "similar", "edit"), 0)
    )
    phases_ms: dict[str, deque] = field(
        default_factory=lambda: {name: deque(maxlen=LATENCY_WINDOW) for name in PHASES}
    )

    def answer(self, latency_ms: float, *, empty: bool) -> None:
        self.answered += 1
        self.empty += int(empty)
        self.latencies_ms.append(latency_ms)

    def record_generation(self, result: Any) -> None:
        """Fold in one ``speculative_complete.decoding.GenerationResult`` (partial ones too: their
        passes were spent)."""
        stats = result.stats
        self.decodes += 1
        self.stop_reasons[result.stop_reason] = self.stop_reasons.get(result.stop_reason, 0) + 1
        self.produced_tokens += stats.produced_tokens
        self.target_passes += stats.target_passes
        tokens, passes = stats.after_prefill
        self.tokens_after_prefill += tokens
        self.passes_after_prefill += passes
        self.known_tokens += stats.known_tokens
        for name, per in stats.drafters.items():
            totals = self.drafters.setdefault(name, DrafterTotals())
            totals.proposed += per.proposed
            totals.accepted += per.accepted

    def record_prefetch(self, result: Any) -> None:
        """A decode ahead in idle time; counted apart, so request statistics stay about requests."""
        self.prefetch["runs"] += 1
        self.prefetch["preempted" if result.stop_reason == "cancelled" else "completed"] += 1
        self.prefetch["tokens"] += result.stats.produced_tokens
        self.prefetch["target_passes"] += result.stats.target_passes

    def record_phases(self, *, queue_ms: float, prompt_ms: float, stats: Any, post_ms: float) -> None:
        """Where an answered decode's time went (``stats``: its
        ``speculative_complete.decoding.GenerationStats``)."""
        other = max(0.0, stats.decode_ms - stats.draft_ms - stats.verify_ms)
        for name, ms in zip(
            PHASES,
            (queue_ms, prompt_ms, stats.prefill_ms, stats.draft_ms, stats.verify_ms, other, post_ms),
            strict=True,
        ):
            self.phases_ms[name].append(ms)

    def snapshot(self) -> dict[str, Any]:
        latencies = list(self.latencies_ms)
        return {
            "requests": self.requests,
            "answered": self.answered,
            "cancelled": self.cancelled,
            "superseded": self.superseded,
            "mid_word": self.mid_word,
            "failed": self.failed,
            "empty": self.empty,
            "errors": self.errors,
            "budget_exhausted": self.budget_exhausted,
            "decodes": self.decodes,
            "stop_reasons": dict(self.stop_reasons),
            "latency_ms": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)},
            "tokens_per_pass": (
                round(self.produced_tokens / self.target_passes, 4) if self.target_passes else None
            ),
            "tokens_per_pass_after_prefill": (
                round(self.tokens_after_prefill / self.passes_after_prefill, 4)
                if self.passes_after_prefill
                else None
            ),
            "drafters": {name: totals.to_dict() for name, totals in self.drafters.items()},
            "known_tokens": self.known_tokens,
            "reuse": dict(self.reuse),
            "prefetch": dict(self.prefetch),
            "excerpts": dict(self.excerpts),
            "phases_ms": {
                name: {
                    "p50": percentile(list(values), 50),
                    "p95": percentile(list(values), 95),
                    "mean": round(sum(values) / len(values), 2) if values else None,
                }
                for name, values in self.phases_ms.items()
            },
        }
