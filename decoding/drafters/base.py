"""The drafter interface: where proposed tokens come from.

A drafter sees the whole token sequence so far (prompt plus accepted output) and proposes up to
``max_len`` next tokens; the engine verifies them with one target pass and reports back how many
were kept. Passing the whole sequence, rather than deltas, lets a stateful drafter (a draft
model with its own KV cache) roll itself back by comparing with what it cached: the engine never
has to know how a drafter stores its state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from decoding.verify import SamplingParams


@dataclass
class Draft:
    """Proposed tokens and, for sampled drafts, the rows ``q`` each one was drawn from."""

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # (len(tokens), vocab); None for deterministic sources
    source: str = ""  # the drafter that produced it, for per-drafter statistics
    match_length: int = 0  # n-gram drafts: how many trailing tokens matched (a confidence signal)
    origin: str = ""  # n-gram drafts: the stream matched ("live", "history", "doc:<uri>", "corpus")

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    name: str

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        session: str | None = None,
    ) -> None:
        """A new generation starts from ``prompt``; sampled drafters must draw with ``sampling``.

        ``session`` names the token stream (the server passes the document), so a drafter with
        per-stream state (a draft model's KV cache) can keep one per document."""

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        """Up to ``max_len`` tokens expected to follow ``tokens``; an empty draft means "don't speculate"."""

    def observe(self, draft: Draft, accepted: int) -> None:
        """``accepted`` of the draft's tokens were kept by the target."""

    def forget(self, session: str) -> None:
        """The session (a closed document) is over: drop whatever is kept for it."""
