"""Prompt lookup: propose what followed the latest earlier occurrence of the current suffix.

Code repeats itself (names, call shapes, whole lines copied from above or from another open
file), and a match costs nothing to find, so this is the drafter that pays on a CPU. Each token
stream (the live sequence, other open documents, previously accepted completions) has an index
from n-gram to end positions that is extended as tokens arrive rather than rescanned per step.
The longest match wins; among equally long ones the live sequence first, then accepted
completions, then other documents, and within a stream the most recent occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoding.drafters.base import Draft, common_prefix_length
from decoding.drafters.length import AcceptanceStats, CostModel, best_draft_length
from decoding.verify import SamplingParams


class TokenIndex:
    """n-gram -> end positions (ascending) over one growing token stream."""

    def __init__(self, tokens: Sequence[int] = (), min_n: int = 1, max_n: int = 6) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._positions: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        toks = self.tokens
        for end in range(max(start + 1, self.min_n), len(toks) + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._positions.setdefault(tuple(toks[end - n:end]), []).append(end)

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index cover exactly ``tokens``: extend when it only grew, rebuild otherwise."""
        if len(tokens) >= len(self.tokens) and common_prefix_length(self.tokens, tokens) == len(self.tokens):
            self.extend(tokens[len(self.tokens):])
        else:
            self.tokens, self._positions = [], {}
            self.extend(tokens)

    def continuation(self, key: tuple[int, ...], max_len: int, before: int | None = None) -> list[int]:
        """What followed the most recent occurrence of ``key`` that ends before ``before``."""
        limit = len(self.tokens) if before is None else before
        for end in reversed(self._positions.get(key, ())):
            if end < limit:
                return self.tokens[end:end + max_len]
        return []


@dataclass
class Match:
    tokens: list[int]
    length: int  # how many trailing tokens matched
    source: str


class NgramDrafter:
    """Prompt lookup over the live sequence plus any number of extra token sources."""

    name = "ngram"
    HISTORY_LIMIT = 8192  # tokens of accepted completions kept as a draft source

    def __init__(self, min_n: int = 1, max_n: int = 6, max_draft: int = 8,
                 cost: CostModel | None = None) -> None:
        self.min_n, self.max_n, self.max_draft = min_n, max_n, max_draft
        self.cost = cost or CostModel()
        self.stats = AcceptanceStats()
        self._live = TokenIndex(min_n=min_n, max_n=max_n)
        self._history = TokenIndex(min_n=min_n, max_n=max_n)
        self._sources: dict[str, TokenIndex] = {}

    # -- extra sources ---------------------------------------------------------------------------
    def set_source(self, name: str, tokens: Sequence[int]) -> None:
        """Add or refresh a document; unchanged prefixes are not re-indexed."""
        index = self._sources.get(name)
        if index is None:
            self._sources[name] = TokenIndex(tokens, self.min_n, self.max_n)
        else:
            index.sync(tokens)

    def remove_source(self, name: str) -> None:
        self._sources.pop(name, None)

    def add_accepted(self, tokens: Sequence[int]) -> None:
        """Remember a completion the user accepted: it is likely to be typed again."""
        if len(self._history) + len(tokens) > self.HISTORY_LIMIT:
            keep = self._history.tokens[-(self.HISTORY_LIMIT // 2):]
            self._history = TokenIndex(keep, self.min_n, self.max_n)
        self._history.extend(tokens)

    # -- Drafter ---------------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int], sampling: SamplingParams,
              generator: torch.Generator | None, session: str | None = None) -> None:
        self._live.sync(prompt)

    def lookup(self, tokens: Sequence[int], max_len: int) -> Match | None:
        """The longest, most recent earlier occurrence of the sequence's suffix, and what followed it."""
        if max_len <= 0:
            return None
        self._live.sync(tokens)
        ordered = [("live", self._live), ("history", self._history)]
        ordered += [(f"doc:{name}", index) for name, index in self._sources.items()]
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            key = tuple(tokens[len(tokens) - n:])
            for source, index in ordered:
                # In the live stream the suffix itself is indexed; only earlier ends have a continuation.
                before = len(tokens) if index is self._live else None
                found = index.continuation(key, max_len, before)
                if found:
                    return Match(tokens=found, length=n, source=source)
        return None

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        match = self.lookup(tokens, min(max_len, self.max_draft))
        if match is None:
            return Draft(source=self.name)
        alpha = self.stats.alpha(match.length)
        k, _ = best_draft_length(alpha, len(match.tokens), self.cost, draft_cost=0.0)
        return Draft(tokens=match.tokens[:max(k, 1)], source=self.name, match_length=match.length)

    def observe(self, draft: Draft, accepted: int) -> None:
        self.stats.update(draft.match_length, accepted, len(draft))
