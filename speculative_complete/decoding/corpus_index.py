"""A large, read-only draft source (the workspace's files) with a longest-suffix lookup.

The n-gram drafter's per-stream index (``speculative_complete.decoding.drafters.ngram.TokenIndex``)
keeps a dict entry per n-gram and costs hundreds of bytes per token: right for the few open
documents, which change on every keystroke, and far too much for a workspace of millions of tokens
that changes on a save. This index is a suffix array over the *reversed* token stream (documents
joined by a separator): the suffixes of the reversed stream are the text read backwards from each
position, so the positions whose preceding tokens agree longest with the sequence's tail sit next to
each other in it, and one binary search finds the longest match of any length (not only up to a
fixed n) and every place it occurs. It costs 8 bytes per token (the reversed tokens and the array,
int32) and a lookup ~20 comparisons of at most ``MAX_MATCH`` tokens each (timed by
``benchmarks/corpus_bench.py``). libdivsufsort releases the GIL, so the array can be built on a
thread of its own while the decode worker runs.

Hashed n-grams would answer in O(1) but bound the match length by the largest n kept and cost a
table per n; the match length is what tells the drafter how far to trust a match, and code's
long repeats (a call retyped from another file) are what pays. The array is built by
libdivsufsort (``pydivsufsort``), a C implementation that takes any integer alphabet.

A leaf module, not part of ``speculative_complete.decoding.drafters``: the drafter interface names
it (the server hands the index to a drafter's ``DocumentSources``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

SEPARATOR = -1  # between documents: no match and no continuation crosses a file boundary
MAX_MATCH = 64  # the default for ``longest``: the n-gram drafter passes its own
CANDIDATES = 32  # equally long matches looked at for the one with the longest continuation


@dataclass(frozen=True)
class CorpusMatch:
    tokens: list[int]  # what followed the match (up to the requested length, never past its file)
    length: int  # how many trailing tokens of the sequence matched (at most ``max_match``)


class CorpusIndex:
    """Suffix array over the reversed concatenation of documents; immutable once built."""

    def __init__(self, documents: Iterable[Sequence[int]] = ()) -> None:
        parts: list[np.ndarray] = []
        for tokens in documents:
            if len(tokens):
                parts += [np.asarray(tokens, dtype=np.int32), np.array([SEPARATOR], dtype=np.int32)]
        self.documents = len(parts) // 2
        # reversed[p] == tokens[N - 1 - p]: a suffix of ``reversed`` is the text before a position.
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        self._reversed = tokens[::-1].copy()
        # Only positions that something follows (not a document's end) are kept: the rest of
        # the array stays sorted, so every match found has a continuation.
        order = _suffix_array(self._reversed)
        followed = np.zeros(len(self._reversed), dtype=bool)
        followed[1:] = self._reversed[:-1] != SEPARATOR
        self._order = order[followed[order]]

    def __len__(self) -> int:
        return len(self._reversed) - self.documents  # separators are not tokens

    @property
    def nbytes(self) -> int:
        return self._reversed.nbytes + self._order.nbytes

    def longest(
        self, sequence: Sequence[int], max_len: int, min_length: int = 1, max_match: int = MAX_MATCH
    ) -> CorpusMatch | None:
        """The longest match of ``sequence``'s tail (at least ``min_length`` tokens, at most
        ``max_match``: agreement past it tells nothing more) and up to ``max_len`` of the tokens
        after it; among equally long matches (the first ``CANDIDATES``) the one with the most
        tokens to propose."""
        if max_len <= 0 or not len(self._order) or not len(sequence):
            return None
        query = np.asarray(sequence[-max_match:][::-1], dtype=np.int32)
        at = self._insertion_point(query)
        lengths = {i: self._agreement(query, i) for i in (at - 1, at) if 0 <= i < len(self._order)}
        length = max(lengths.values(), default=0)
        if length < max(min_length, 1):
            return None
        best: list[int] = []
        for i in self._equal_run(query, at if lengths.get(at) == length else at - 1, length):
            follows = self._continuation(int(self._order[i]), max_len)
            if len(follows) > len(best):
                best = follows
            if len(best) >= max_len:
                break
        return CorpusMatch(tokens=best, length=length)

    # -- the search --------------------------------------------------------------------------------
    def _agreement(self, query: np.ndarray, i: int) -> int:
        """How many leading tokens of ``query`` the ``i``-th suffix of the reversed stream shares."""
        start = int(self._order[i])
        window = self._reversed[start : start + len(query)]
        differ = np.flatnonzero(window != query[: len(window)])
        return int(differ[0]) if len(differ) else len(window)

    def _less(self, i: int, query: np.ndarray) -> bool:
        """Whether the ``i``-th suffix sorts before ``query`` (a suffix that is a prefix of the
        query sorts before it)."""
        n = self._agreement(query, i)
        start = int(self._order[i])
        if n == len(query):
            return False
        if start + n >= len(self._reversed):
            return True
        return bool(self._reversed[start + n] < query[n])

    def _insertion_point(self, query: np.ndarray) -> int:
        low, high = 0, len(self._order)
        while low < high:
            mid = (low + high) // 2
            if self._less(mid, query):
                low = mid + 1
            else:
                high = mid
        return low

    def _equal_run(self, query: np.ndarray, i: int, length: int) -> list[int]:
        """Array positions around ``i`` that share ``length`` tokens with ``query`` (at most
        ``CANDIDATES``): the matches are contiguous in the array."""
        found = [i]
        for step in (-1, 1):
            j = i + step
            while (
                0 <= j < len(self._order) and len(found) < CANDIDATES and self._agreement(query, j) >= length
            ):
                found.append(j)
                j += step
        return found

    def _continuation(self, reversed_start: int, max_len: int) -> list[int]:
        # The match ends right before tokens[N - reversed_start]; what follows, read backwards.
        follows = self._reversed[max(0, reversed_start - max_len) : reversed_start][::-1]
        stop = np.flatnonzero(follows == SEPARATOR)
        return follows[: stop[0] if len(stop) else len(follows)].tolist()


def _suffix_array(tokens: np.ndarray) -> np.ndarray:
    """The suffix array of ``tokens`` (int32). The values are first mapped, order kept, onto
    0..distinct-1 so that libdivsufsort gets the narrowest integer type (it encodes each element
    as that many bytes)."""
    if not len(tokens):
        return np.zeros(0, dtype=np.int32)
    from pydivsufsort import divsufsort

    _, dense = np.unique(tokens, return_inverse=True)
    dense = dense.astype(np.uint16 if dense.max() < 1 << 16 else np.uint32)
    return np.asarray(divsufsort(dense), dtype=np.int32)
