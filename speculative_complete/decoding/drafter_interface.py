"""The drafter interface: where proposed tokens come from.

A drafter sees the whole token sequence so far (prompt plus accepted output) and proposes up to
``max_len`` next tokens; the engine verifies them with one target pass and reports back how many
were kept. Passing the whole sequence, rather than deltas, lets a stateful drafter (a draft
model with its own KV cache) roll itself back by comparing with what it cached: the engine never
has to know how a drafter stores its state.

A leaf below both sides: the engine (``speculative_complete.decoding.engine``) calls drafters only
through this module, and a drafter (``speculative_complete.decoding.drafters``, or a new one:
``docs/adding-a-drafter.md``) implements it without importing the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from speculative_complete.decoding.verify import SamplingParams

if TYPE_CHECKING:
    from speculative_complete.decoding.corpus_index import CorpusIndex
    from speculative_complete.decoding.results import DrafterStats


class OwedText(Protocol):
    """What token healing still owes, as a drafter is shown it while a prompt's last word is
    being written (``speculative_complete.decoding.engine.healing.Healing``)."""

    def allowed_after(self, tokens: Sequence[int]) -> tuple[bytes, tuple[int, ...]] | None:
        """After the drafted ``tokens`` (allowed ones): the bytes still owed (a key for caches)
        and the sorted ids that may come next; None once the owed text is written."""

    def allowed_length(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, may be drafted in turn (all, once the text is
        written)."""


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


class DocumentSources(Protocol):
    """What the server feeds a drafter that drafts from text beyond the prompt
    (``speculative_complete.decoding.drafters.ngram.NgramDrafter``): other open documents, accepted
    completions and the workspace's index."""

    corpus: CorpusIndex | None  # the workspace's index (the server's worker replaces it)
    corpus_counts: DrafterStats  # how the index's own drafts fared

    def set_source(self, name: str, tokens: Sequence[int]) -> None:
        """Add or refresh a document's tokens."""

    def remove_source(self, name: str) -> None:
        """Drop a document (closed, or the one being edited)."""

    def add_accepted(self, tokens: Sequence[int]) -> None:
        """A completion the user accepted: likely to be typed again."""


class Drafter(Protocol):
    """What the engine calls on a drafter. The last five are optional capabilities with no-op
    defaults here: a drafter class subclasses ``Drafter`` to inherit them, and overrides the
    ones it has (the engine calls them on every drafter, never probes for them)."""

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

    def attach(self, target_cache: Any) -> None:
        """The target's cache this generation feeds, shown before each proposal: a drafter that
        reads the target's hidden states (a draft head) drafts from it; others ignore it."""

    def steer(self, owed: OwedText | None) -> None:
        """While token healing owes text, what it allows after each drafted prefix (None:
        anything), shown before each proposal: a draft the target's masked pass would refuse at
        once is a wasted pass, so a drafter may draft within it; others ignore it (the engine cuts
        every draft where healing refuses it)."""

    def end_at(self, ends: Callable[[int], bool]) -> None:
        """Which tokens end the generation (``engine.stops.EndingTokens``), shown before each
        proposal: a greedy draft may stop before one, the target's pass giving its own token there
        anyway (the engine cuts every deterministic draft there); a sampled one must not, its
        length being decided before each draw. Others ignore it."""

    def document_sources(self) -> DocumentSources | None:
        """The drafter that drafts from other open documents and the workspace, where this drafter
        has one (the server feeds it their tokens); None: it has none."""
        return None
