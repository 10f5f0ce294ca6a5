"""Prefix KV-cache reuse across requests, per document, within a memory budget.

On the 2-core CPU a cold 512-token prefill takes ~1 s and a decode step ~62 ms. Consecutive
requests on one document share almost all of their prompt (the user typed a character), so the
KV cache a generation leaves behind is kept under the document's key, and the next request there
feeds only the tokens after the longest common token prefix. Reuse is exact: a causal model's
keys and values for a token depend only on the tokens before it, so the common prefix's entries
are the ones a fresh prefill would compute; everything after the first differing token (an edit
before the cursor, a different completion) is cropped away.

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
    tokens: list[int]  # the tokens whose keys and values the cache holds, in order
    cache: DynamicCache
    nbytes: int


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

    def take(self, key: str, prompt: Sequence[int]) -> tuple[DynamicCache | None, int]:
        """Borrow ``key``'s cache cropped to its longest common prefix with ``prompt``.

        Returns the cache and how many of ``prompt``'s tokens it already holds: always fewer than
        ``len(prompt)``, because the last prompt token must be fed to get the next-token logits.
        ``(None, 0)`` when nothing is reusable. The entry leaves the store until ``put`` returns it.
        """
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(prompt)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry.nbytes
        if entry is None:
            return None, 0
        keep = min(common_prefix_length(entry.tokens, prompt), len(prompt) - 1, cache_length(entry.cache))
        if keep <= 0:
            return None, 0
        extra = cache_length(entry.cache) - keep
        if extra > 0:
            try:
                entry.cache.crop(-extra)
            except Exception:  # a cache type that can't roll back (e.g. sliding windows): start afresh
                return None, 0
        with self._lock:
            self.stats.hits += 1
            self.stats.reused_tokens += keep
        return entry.cache, keep

    def put(self, key: str, tokens: Sequence[int], cache: DynamicCache) -> None:
        """Keep ``cache`` (holding exactly ``tokens``) as ``key``'s, evicting old entries as needed."""
        if not self.enabled or not tokens or cache_length(cache) != len(tokens):
            return
        nbytes = cache_nbytes(cache)
        if nbytes > self.budget_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = _Entry(list(tokens), cache, nbytes)
            self._bytes += nbytes
            while self._bytes > self.budget_bytes:  # the new entry alone fits: it is never the one evicted
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1

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
