"""Prefix KV-cache reuse across requests, per document, within a memory budget.

On the 2-core CPU a cold 512-token prefill takes ~1 s and a decode step ~62 ms. Consecutive
requests on one document share almost all of their prompt (the user typed a character), so the
KV cache a generation leaves behind is kept under the document's key, and the next request there
feeds only the tokens after the longest common token prefix. Reuse is exact: a causal model's
keys and values for a token depend only on the tokens before it, so the common prefix's entries
are the ones a fresh prefill would compute; everything after the first differing token (an edit
before the cursor, a different completion) is cropped away.

Each entry also remembers the tokens the model generated after its prompt. Under greedy decoding
they are the target's own choices, so a later prompt that lies on that path (the user typed the
first characters of the suggestion, or asked again at the same place) already has its
continuation: the rest of the known tokens, with no model call at all. That is typed-ahead
reuse, exact by construction rather than by comparing text.

transformers' ``DynamicCache`` holds the tensors; this module only decides which cache serves a
request and which to evict. Entries are least-recently-used first out when the budget is
exceeded, and an entry is lent out (removed from the store) while a generation uses it, so a
cache is never shared by two generations.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from transformers import DynamicCache

from decoding.drafters.base import common_prefix_length


def cache_nbytes(cache: DynamicCache) -> int:
    """Bytes the cache's tensors keep alive (a cropped layer is a view of a larger storage)."""
    total = 0
    for layer in getattr(cache, "layers", ()):
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


@dataclass
class _Entry:
    tokens: list[int]  # the cache holds keys and values for tokens[:cache_length(cache)]
    cache: DynamicCache
    nbytes: int
    greedy_from: int | None  # tokens[greedy_from:] are the target's unconstrained greedy choices


@dataclass
class Borrowed:
    """What ``take`` lends a generation."""

    cache: DynamicCache | None  # None: start from an empty cache
    reused: int = 0  # prompt tokens the cache already holds
    known: list[int] | None = None  # the target's greedy continuation of the prompt, when known
    greedy_from: int | None = None  # for ``put``: where the chain of greedy choices began


class PrefixCache:
    """Per-key KV caches, LRU-evicted to stay within ``budget_bytes`` (0 disables reuse)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # generations run on a worker; stats and drops come from elsewhere

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def take(self, key: str, prompt: Sequence[int], *, continuation: bool = False) -> Borrowed:
        """Borrow ``key``'s cache for ``prompt``; the entry leaves the store until ``put``.

        With ``continuation`` (greedy decoding), a prompt that is a strict prefix of the entry's
        tokens and reaches into its greedy chain gets the rest of the chain as ``known``, and the
        cache as it is (holding every known token but the last, as the engine's loop expects).
        Otherwise the cache is cropped to the longest common prefix with ``prompt``, always short
        of the prompt's last token, which must be fed to get the next-token logits.
        """
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(prompt)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
        if entry is None:
            return Borrowed(None)
        common = common_prefix_length(entry.tokens, prompt)
        held = cache_length(entry.cache)
        on_chain = (common == len(prompt) and entry.greedy_from is not None
                    and len(prompt) >= entry.greedy_from)
        if continuation and on_chain and len(prompt) < len(entry.tokens) and held == len(entry.tokens) - 1:
            self._count_reuse(len(prompt))
            return Borrowed(entry.cache, len(prompt), list(entry.tokens[len(prompt):]), entry.greedy_from)
        keep = min(common, len(prompt) - 1, held)
        if keep <= 0:
            return Borrowed(None)
        if held > keep:
            try:
                entry.cache.crop(keep - held)
            except Exception:  # a cache type that can't roll back (e.g. sliding windows): start afresh
                return Borrowed(None)
        self._count_reuse(keep)
        return Borrowed(entry.cache, keep, None, entry.greedy_from if on_chain else None)

    def _count_reuse(self, tokens: int) -> None:
        with self._lock:
            self.stats.hits += 1
            self.stats.reused_tokens += tokens

    def put(self, key: str, tokens: Sequence[int], cache: DynamicCache,
            greedy_from: int | None = None) -> None:
        """Keep ``cache`` as ``key``'s: it holds ``tokens`` (all, or all but the last), of which
        ``tokens[greedy_from:]`` are greedy choices (None: none are). Evicts old entries as needed."""
        if not self.enabled or not tokens or cache_length(cache) not in (len(tokens), len(tokens) - 1):
            return
        nbytes = cache_nbytes(cache)
        if nbytes > self.budget_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = _Entry(list(tokens), cache, nbytes, greedy_from)
            self._bytes += nbytes
            while self._bytes > self.budget_bytes:  # the new entry alone fits: it is never the one evicted
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1

    def chain(self, key: str) -> tuple[list[int], int | None] | None:
        """``key``'s tokens and where its greedy chain begins, without borrowing the cache."""
        with self._lock:
            entry = self._entries.get(key)
            return (list(entry.tokens), entry.greedy_from) if entry is not None else None

    def drop(self, key: str) -> None:
        """Forget ``key`` (its document was closed)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes

    def resize(self, budget_bytes: int) -> None:
        with self._lock:
            self.budget_bytes = max(0, int(budget_bytes))
            while self._entries and self._bytes > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "budget_bytes": self.budget_bytes,
                    "lookups": self.stats.lookups, "hits": self.stats.hits,
                    "prompt_tokens": self.stats.prompt_tokens, "reused_tokens": self.stats.reused_tokens,
                    "reused_share": round(self.stats.reused_share, 4), "evictions": self.stats.evictions}
