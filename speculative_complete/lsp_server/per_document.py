"""Everything the server keeps per document, forgotten in one place.

Several owners keep state keyed by a document's URI: the answers remembered (``reuse.py``), the
KV cache and greedy chain (``speculative_complete.decoding.kv_cache.PrefixCache``), the n-gram
drafter's sources (``sources.py``), a draft model's per-document cache, the parse trees
(``syntax.ParseCache``) and the snippet windows (``snippets.SnippetIndex``). Each registers its
``forget`` here; closing a document, or its falling out of the ``max_documents`` most recently used
ones, calls them all.

Owners used on the event loop (or guarded by a lock) are told at once. The worker's owners (parse
trees, snippet windows, drafters) are not thread-safe: they are told on the worker, before its
next job (``forget_on_worker``), which is also where a decode still running for the document
ends first. What a decode finishing after the close would write back is refused by its owner
(``PrefixCache`` revokes a lent cache) or by the caller, which checks ``current`` first.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable

MAX_DOCUMENTS = 64  # documents with state at once; an editor rarely has more in use

Forget = Callable[[str], None]


class DocumentRegistry:
    def __init__(self, max_documents: int = MAX_DOCUMENTS) -> None:
        self.max_documents = max_documents
        self._at_once: list[Forget] = []
        self._on_worker: list[Forget] = []
        self._recent: OrderedDict[str, int] = OrderedDict()  # uri -> its generation; least recent first
        self._generations = itertools.count(1)
        self._pending: list[str] = []  # forgotten, not yet told to the worker's owners
        self._lock = threading.Lock()

    def owner(self, forget: Forget, *, worker: bool = False) -> None:
        """Register an owner's ``forget``; ``worker``: call it on the worker thread only."""
        (self._on_worker if worker else self._at_once).append(forget)

    # -- event loop ---------------------------------------------------------------------------------
    def touch(self, uri: str) -> int:
        """A request for ``uri``: it becomes the most recently used. Returns its generation, which
        ``current`` compares with to tell whether it was forgotten meanwhile."""
        generation = self._recent.get(uri)
        if generation is None:
            generation = self._recent[uri] = next(self._generations)
        self._recent.move_to_end(uri)
        while len(self._recent) > self.max_documents:
            self.forget(next(iter(self._recent)))
        return generation

    def current(self, uri: str, generation: int) -> bool:
        """Whether ``uri`` still has the state of ``generation`` (it was not forgotten since)."""
        return self._recent.get(uri) == generation

    def forget(self, uri: str) -> None:
        """Drop everything kept for ``uri``: at once where that is safe, else before the worker's
        next job."""
        self._recent.pop(uri, None)
        for forget in self._at_once:
            forget(uri)
        with self._lock:
            self._pending.append(uri)

    @property
    def tracked(self) -> int:
        return len(self._recent)

    # -- worker ---------------------------------------------------------------------------------------
    def forget_on_worker(self) -> int:
        """Tell the worker's owners what was forgotten since the last call; how many documents."""
        with self._lock:
            pending, self._pending = self._pending, []
        for uri in pending:
            for forget in self._on_worker:
                forget(uri)
        return len(pending)
