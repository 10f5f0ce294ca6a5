"""Prompt lookup: propose what followed the latest earlier occurrence of the current suffix.

Code repeats itself (names, call shapes, whole lines copied from above or from another open
file), and a match costs nothing to find, so this is the drafter that pays on a CPU. Each token
stream (the live sequence, other open documents, previously accepted completions) has an index
from n-gram to end positions that is extended as tokens arrive rather than rescanned per step.
A corpus (``speculative_complete.decoding.corpus_index.CorpusIndex``: the workspace's files, too
large for these per-stream indexes) is consulted last and wins only with a strictly longer match
that its own acceptance statistics expect to gain more.
The longest match wins; among equally long ones (or ones both past ``SURE_MATCH`` tokens) the
one with more tokens to propose, then the live sequence first, then accepted completions, then
other documents, and within a stream the most recent occurrence.

"Longest" is measured past the index's n-gram size: each occurrence of the suffix's longest
indexed n-gram is extended backwards token by token. Code repeats short n-grams everywhere
(``self.`` plus a name, an indentation run), so the most recent 6-gram is often in the wrong
place, while the copy the user is retyping agrees with the text before the cursor for dozens of
tokens. The extended length also tells the acceptance statistics how much to trust the match.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import torch

from speculative_complete.decoding.corpus_index import CorpusIndex
from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.drafter_interface import Draft, Drafter
from speculative_complete.decoding.drafters.length import AcceptanceStats, best_draft_length
from speculative_complete.decoding.kv_cache import common_prefix_length
from speculative_complete.decoding.results import DrafterStats
from speculative_complete.decoding.verify import SamplingParams


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
                self._positions.setdefault(tuple(toks[end - n : end]), []).append(end)

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index cover exactly ``tokens``: extend when it only grew, rebuild otherwise."""
        if len(tokens) >= len(self.tokens) and common_prefix_length(self.tokens, tokens) == len(self.tokens):
            self.extend(tokens[len(self.tokens) :])
        else:
            self.tokens, self._positions = [], {}
            self.extend(tokens)

    def ends(self, key: tuple[int, ...], before: int | None = None) -> Iterator[int]:
        """End positions of ``key`` that something follows (and that end before ``before``),
        the most recent first."""
        limit = len(self.tokens) if before is None else min(before, len(self.tokens))
        for end in reversed(self._positions.get(key, ())):
            if end < limit:
                yield end

    def continuation(self, key: tuple[int, ...], max_len: int, before: int | None = None) -> list[int]:
        """What followed the most recent occurrence of ``key`` that ends before ``before``."""
        end = next(self.ends(key, before), None)
        return [] if end is None else self.tokens[end : end + max_len]

    def agreement(self, start: int, tokens: Sequence[int], at: int, limit: int, resyncs: int = 2) -> int:
        """How many tokens before ``start`` in this stream equal those before ``at`` in ``tokens``
        (at most ``limit``): how far a match extends backwards.

        The same text cut at another place is tokenized differently for a token or two (an
        indentation run split before a word, a word split by the cursor), so up to ``resyncs``
        such spots are stepped over where the two streams line up again right before them.
        """
        own, n, i, j = self.tokens, 0, start, at
        while n < limit and i > 0 and j > 0:
            if own[i - 1] == tokens[j - 1]:
                n, i, j = n + 1, i - 1, j - 1
                continue
            skip = (
                next(
                    (
                        (di, dj)
                        for di, dj in RESYNC_SKIPS
                        if i - di >= 2
                        and j - dj >= 2
                        and own[i - di - 1] == tokens[j - dj - 1]
                        and own[i - di - 2] == tokens[j - dj - 2]
                    ),
                    None,
                )
                if resyncs
                else None
            )
            if skip is None:
                break
            resyncs, i, j = resyncs - 1, i - skip[0], j - skip[1]
        return n


# Acceptance priors for corpus matches by match length (see ``AcceptanceStats``): below those of
# the streams in view until the corpus's drafts show otherwise.
CORPUS_PRIORS = {2: 0.1, 4: 0.25, 8: 0.45, 16: 0.65, 32: 0.85}
# (tokens skipped in the stream, in the sequence) to line the two up again after a disagreement
RESYNC_SKIPS = ((1, 1), (0, 1), (1, 0), (2, 1), (1, 2), (2, 2))


@dataclass
class Match:
    tokens: list[int]
    length: int  # how many trailing tokens matched (up to ``NgramDrafter.MAX_MATCH``); 0: see below
    source: str
    # A sequence that ends at another token boundary than the copy it retypes (a cursor inside an
    # indentation run or a word) has no exact match for its last tokens; the copy is then found
    # from the tokens before them and ``skipped`` of its tokens are taken to stand for them. Such a
    # match has ``length`` 0, so its acceptance is learned apart from the exact ones.
    skipped: int = 0


class NgramDrafter(Drafter):
    """Prompt lookup over the live sequence plus any number of extra token sources."""

    name = "ngram"
    HISTORY_LIMIT = 8192  # tokens of accepted completions kept as a draft source
    CANDIDATES = 32  # most recent occurrences per source that are extended backwards
    MAX_MATCH = 64  # extending a match further back costs time and tells nothing more
    SURE_MATCH = 32  # matches at least this long count as equally trustworthy (one stats bucket)
    SHORT_MATCH = 4  # an exact match shorter than this gives way to a long one skipping the last tokens
    SKIP_MATCH = 12  # how long a match skipping the last tokens must be to be trusted at all
    CORPUS_MIN_MATCH = 2  # a single token recurs everywhere in a large corpus: no evidence at all

    def __init__(
        self, min_n: int = 1, max_n: int = 6, max_draft: int = 16, cost: CostModel | None = None
    ) -> None:
        self.min_n, self.max_n, self.max_draft = min_n, max_n, max_draft
        self.cost = cost or CostModel()
        self.stats = AcceptanceStats()
        # The corpus's matches are learned apart: a match as long as one in view is found in a far
        # larger text, so it is more often a coincidence.
        self.corpus_stats = AcceptanceStats(priors=dict(CORPUS_PRIORS))
        self._live = TokenIndex(min_n=min_n, max_n=max_n)
        self._history = TokenIndex(min_n=min_n, max_n=max_n)
        self._sources: dict[str, TokenIndex] = {}
        # A large read-only source (the workspace's files), swapped whole when it is rebuilt (on
        # another thread: a reference assignment, which lookups read once).
        self.corpus: CorpusIndex | None = None
        self.corpus_counts = DrafterStats()  # the corpus's drafts alone (the engine counts all)

    # -- extra sources ---------------------------------------------------------------------------
    def document_sources(self) -> NgramDrafter:
        return self

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
            keep = self._history.tokens[-(self.HISTORY_LIMIT // 2) :]
            self._history = TokenIndex(keep, self.min_n, self.max_n)
        self._history.extend(tokens)

    # -- Drafter ---------------------------------------------------------------------------------
    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        session: str | None = None,
    ) -> None:
        self._live.sync(prompt)

    def forget(self, session: str) -> None:
        """The session's document was closed: it is no longer a source."""
        self.remove_source(session)

    def lookup(self, tokens: Sequence[int], max_len: int) -> Match | None:
        """The longest, most recent earlier occurrence of the sequence's suffix, and what followed it."""
        if max_len <= 0:
            return None
        self._live.sync(tokens)
        exact = None
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            exact = self._best(tokens, len(tokens), n, max_len)
            if exact is not None:
                break
        if exact is not None and exact.length >= self.SHORT_MATCH:
            return self._or_corpus(tokens, max_len, exact)
        for skipped in (1, 2):
            n = min(self.max_n, len(tokens) - skipped)
            fuzzy = self._best(tokens, len(tokens) - skipped, n, max_len, skipped) if n >= 1 else None
            if fuzzy is not None and fuzzy.length >= self.SKIP_MATCH:
                return Match(tokens=fuzzy.tokens, length=0, source=fuzzy.source, skipped=skipped)
        return self._or_corpus(tokens, max_len, exact)

    def stats_for(self, source: str) -> AcceptanceStats:
        """The acceptance statistics of a match's (or a draft's) source."""
        return self.corpus_stats if source == "corpus" else self.stats

    def _or_corpus(self, tokens: Sequence[int], max_len: int, found: Match | None) -> Match | None:
        """The corpus's match where it is strictly longer than ``found`` and, by what each source's
        drafts have shown so far, expected to gain more (the streams in view win ties: what is
        near the cursor predicts better than the same length elsewhere)."""
        corpus = self.corpus  # read once: a new index may replace it from another thread
        if corpus is None or (found is not None and found.length >= self.SURE_MATCH):
            return found
        shortest = max(self.CORPUS_MIN_MATCH, found.length + 1 if found is not None else 0)
        match = corpus.longest(tokens, max_len, min_length=shortest, max_match=self.MAX_MATCH)
        if match is None:
            return found
        candidate = Match(tokens=match.tokens, length=match.length, source="corpus")
        if found is not None and self.expected_gain(found) >= self.expected_gain(candidate):
            return found
        return candidate

    def expected_gain(self, match: Match) -> float:
        """Speed-up over plain decoding of drafting ``match`` at its best length."""
        alpha = self.stats_for(match.source).alpha(match.length)
        return best_draft_length(alpha, len(match.tokens), self.cost, draft_cost=0.0)[1]

    def _best(self, tokens: Sequence[int], size: int, n: int, max_len: int, skipped: int = 0) -> Match | None:
        """The longest match of the ``n`` tokens before ``size``, continuing ``skipped`` tokens on."""
        ordered = [("live", self._live), ("history", self._history)]
        ordered += [(f"doc:{name}", index) for name, index in self._sources.items()]
        key = tuple(tokens[size - n : size])
        best: tuple[tuple[int, int, int], str, TokenIndex, int] | None = None
        for source, index in ordered:
            # In the live stream the suffix itself is indexed; only earlier ends have a continuation.
            before = size if index is self._live else None
            for end in islice(index.ends(key, before), self.CANDIDATES):
                if end + skipped >= len(index.tokens) or (index is self._live and end + skipped >= size):
                    continue
                length = n + index.agreement(end - n, tokens, size - n, self.MAX_MATCH - n)
                # Equally long, or both past SURE_MATCH: the one with more to propose (a run like
                # 0000 matches right behind the cursor, with one token after it, and in the copy),
                # then the longer, then the earlier source, then the later end.
                available = min(len(index.tokens) - end - skipped, max_len)
                score = (min(length, self.SURE_MATCH), available, length)
                if best is None or score > best[0]:
                    best = (score, source, index, end)
        if best is None:
            return None
        (_, _, length), source, index, end = best
        return Match(
            tokens=index.tokens[end + skipped : end + skipped + max_len], length=length, source=source
        )

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        match = self.lookup(tokens, min(max_len, self.max_draft))
        if match is None:
            return Draft(source=self.name)
        alpha = self.stats_for(match.source).alpha(match.length)
        k, _ = best_draft_length(alpha, len(match.tokens), self.cost, draft_cost=0.0)
        return Draft(
            tokens=match.tokens[: max(k, 1)],
            source=self.name,
            match_length=match.length,
            origin=match.source,
        )

    def observe(self, draft: Draft, accepted: int) -> None:
        self.stats_for(draft.origin).update(draft.match_length, accepted, len(draft))
        if draft.origin == "corpus":
            self.corpus_counts.drafts += 1
            self.corpus_counts.proposed += len(draft)
            self.corpus_counts.accepted += accepted
