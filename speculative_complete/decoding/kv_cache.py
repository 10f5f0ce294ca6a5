"""Prefix KV-cache reuse across requests, per document, within a memory budget.

A cold prefill of a long prompt costs many decode steps (``benchmarks/README.md`` has the
figures). Consecutive requests on one document share almost all of their prompt (the user typed a
character), so the KV cache a generation leaves behind is kept under the document's key, and the
next request there feeds only the tokens after the longest common token prefix. Reuse is exact: a
causal model's keys and values for a token depend only on the tokens before it, so the common prefix's entries
are the ones a fresh prefill would compute; everything after the first differing token (an edit
before the cursor, a different completion) is cropped away.

Each entry also remembers the tokens the model generated after its prompt. Under greedy decoding
they are the target's own choices, so a later prompt that lies on that path (the user typed the
first characters of the suggestion, or asked again at the same place) already has its
continuation: the rest of the known tokens, with no model call at all. That is typed-ahead
reuse, exact by construction rather than by comparing text.

A forward's own cache holds the tensors (for a transformers model, its ``DynamicCache`` with
``speculative_complete.decoding.forward.growing_cache.GrowingLayer``); this module decides which
cache serves a request and which to evict. Entries are least-recently-used first out when the budget
is exceeded, and an entry is lent out (removed from the store) while a generation uses it, so a
cache is never shared by two generations. Dropping a key while its cache is lent revokes the loan:
the generation's ``put`` is then ignored, so a document closed mid-decode leaves nothing behind.

A loan is revoked by forgetting it: the store records only each key's current loan, and a ``put``
is kept only from that loan. Nothing waits for a loan to come back, because some never do: a
generation that raises never puts, nor does a draft model's live session whose document is
closed. A loan left out is replaced by its key's next one or ended by its key's drop, so the store
holds at most one loan per key.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import DynamicCache


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@runtime_checkable
class SizedCache(Protocol):
    """A cache that counts its own bytes (the lean forwards' caches); transformers' ``DynamicCache``
    is counted layer by layer instead."""

    def nbytes(self) -> int: ...


def cache_nbytes(cache: DynamicCache | SizedCache) -> int:
    """Bytes the cache's tensors keep alive (a cropped layer is a view of a larger storage)."""
    if isinstance(cache, SizedCache):
        return int(cache.nbytes())
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is not None and hasattr(tensor, "untyped_storage"):
                total += tensor.untyped_storage().nbytes()
    return total


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0  # lookups that reused at least one token
    prompt_tokens: int = 0  # over all lookups
    reused_tokens: int = 0  # of those, served from a cache instead of prefilled
    evictions: int = 0

    @property
    def reused_share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class Asked:
    """The latest request's prompt on a key: the suggestion shown is what the chain holds past
    ``prompt_tokens``, after the ``owed`` text (token healing's, which the output began with).
    Those tokens were chosen with ``owed`` required (``engine``'s ``_asked_fits`` relies on it)."""

    prompt_tokens: int
    owed: str = ""


@dataclass(frozen=True)
class Chain:
    """A key's tokens and where its greedy chain begins, seen without borrowing the cache."""

    tokens: list[int]
    greedy_from: int | None  # tokens[greedy_from:] are the target's unconstrained greedy choices
    asked: Asked | None


@dataclass
class _Entry:
    tokens: list[int]  # the cache holds keys and values for tokens[:cache_length(cache)]
    cache: DynamicCache
    nbytes: int
    greedy_from: int | None  # tokens[greedy_from:] are the target's unconstrained greedy choices
    asked: Asked | None = None


@dataclass
class Borrowed:
    """What ``take`` lends a generation."""

    cache: DynamicCache | None  # None: start from an empty cache
    reused: int = 0  # prompt tokens the cache already holds
    known: list[int] | None = None  # the target's greedy continuation of the prompt, when known
    greedy_from: int | None = None  # for ``put``: where the chain of greedy choices began
    ticket: int | None = None  # for ``put``: identifies this loan (a drop meanwhile revokes it)
    asked: Asked | None = None  # the entry's record of the latest request


class PrefixCache:
    """Per-key KV caches, LRU-evicted to stay within ``budget_bytes`` (0 disables reuse)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # generations run on a worker; stats and drops come from elsewhere
        self._tickets = 0
        self._lent: dict[str, int] = {}  # key -> the ticket of its current loan (only it may put)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def take(
        self, key: str, prompt: Sequence[int], *, continuation: bool = False, asked: bool = False
    ) -> Borrowed:
        """Borrow ``key``'s cache for ``prompt``; the entry leaves the store until ``put``.

        With ``continuation`` (greedy decoding), a prompt that is a strict prefix of the entry's
        tokens and reaches into its greedy chain gets the rest of the chain as ``known``, and the
        cache as it is (holding every known token but the last, as the engine's loop expects).
        With ``asked`` too, so does the very prompt of the entry's last request, whose next tokens
        token healing chose (the caller has checked that they are what it would choose now).
        Otherwise the cache is cropped to the longest common prefix with ``prompt``, always short
        of the prompt's last token, which must be fed to get the next-token logits.
        """
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(prompt)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
            self._tickets += 1
            ticket = self._lent[key] = self._tickets
        if entry is None:
            return Borrowed(None, ticket=ticket)
        common = common_prefix_length(entry.tokens, prompt)
        held = cache_length(entry.cache)
        last = entry.asked
        at_asked = continuation and asked and last is not None and last.prompt_tokens == len(prompt)
        on_chain = (
            common == len(prompt)
            and entry.greedy_from is not None
            and (len(prompt) >= entry.greedy_from or at_asked)
        )
        if continuation and on_chain and len(prompt) < len(entry.tokens) and held == len(entry.tokens) - 1:
            self._count_reuse(len(prompt))
            return Borrowed(
                entry.cache,
                len(prompt),
                list(entry.tokens[len(prompt) :]),
                entry.greedy_from,
                ticket,
                entry.asked,
            )
        keep = min(common, len(prompt) - 1, held)
        if keep <= 0:
            return Borrowed(None, ticket=ticket)
        if held > keep:
            try:
                entry.cache.crop(keep - held)
            except Exception:  # a cache type that can't roll back (e.g. sliding windows): start afresh
                return Borrowed(None, ticket=ticket)
        self._count_reuse(keep)
        return Borrowed(entry.cache, keep, None, entry.greedy_from if on_chain else None, ticket, entry.asked)

    def _count_reuse(self, tokens: int) -> None:
        with self._lock:
            self.stats.hits += 1
            self.stats.reused_tokens += tokens

    def put(
        self,
        key: str,
        tokens: Sequence[int],
        cache: DynamicCache,
        greedy_from: int | None = None,
        *,
        ticket: int | None = None,
        asked: Asked | None = None,
    ) -> None:
        """Keep ``cache`` as ``key``'s: it holds ``tokens`` (all, or all but the last), of which
        ``tokens[greedy_from:]`` are greedy choices (None: none are). ``ticket`` is the loan's
        (``Borrowed.ticket``): a loan that is no longer the key's current one (revoked by ``drop``,
        or replaced by a later ``take``) is not kept. Evicts old entries as needed."""
        if ticket is not None and self._settle(key, ticket):
            return
        if not self.enabled or not tokens or cache_length(cache) not in (len(tokens), len(tokens) - 1):
            return
        nbytes = cache_nbytes(cache)
        if nbytes > self.budget_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = _Entry(list(tokens), cache, nbytes, greedy_from, asked)
            self._bytes += nbytes
            while self._bytes > self.budget_bytes:  # the new entry alone fits: it is never the one evicted
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1

    def _settle(self, key: str, ticket: int) -> bool:
        """Close the loan ``ticket``; whether it was revoked (its cache must not be kept)."""
        with self._lock:
            if self._lent.get(key) != ticket:
                return True
            del self._lent[key]
            return False

    def chain(self, key: str) -> Chain | None:
        """``key``'s tokens, where its greedy chain begins and what was last asked, without
        borrowing the cache."""
        with self._lock:
            entry = self._entries.get(key)
            return Chain(list(entry.tokens), entry.greedy_from, entry.asked) if entry is not None else None

    def adopt(self, source: str, key: str, prompt: Sequence[int]) -> bool:
        """Make ``source``'s entry ``key``'s where it holds all of ``prompt`` (a prompt prefilled
        under a key of its own while ``key``'s cache went on serving): ``key``'s entry, and any
        loan of it, is dropped. Whether it was adopted."""
        with self._lock:
            entry = self._entries.get(source)  # holds all its tokens but perhaps the last (``put``)
            if entry is None or source in self._lent:
                return False
            if common_prefix_length(entry.tokens, prompt) < len(prompt):
                return False
            del self._entries[source]
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._lent.pop(key, None)
            self._entries[key] = entry
            return True

    def drop(self, key: str) -> None:
        """Forget ``key`` (its document was closed), including a cache lent out right now."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
            self._lent.pop(key, None)  # revoked: its ``put`` will find another loan, or none

    def resize(self, budget_bytes: int) -> None:
        with self._lock:
            self.budget_bytes = max(0, int(budget_bytes))
            while self._entries and self._bytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "entries": len(self._entries),
                "lent": len(self._lent),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
                "lookups": self.stats.lookups,
                "hits": self.stats.hits,
                "prompt_tokens": self.stats.prompt_tokens,
                "reused_tokens": self.stats.reused_tokens,
                "reused_share": round(self.stats.reused_share, 4),
                "evictions": self.stats.evictions,
            }
