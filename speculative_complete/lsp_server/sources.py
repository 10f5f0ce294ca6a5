"""Open documents and accepted suggestions as n-gram draft sources, within a token budget.

Code is copied between files as much as within one, so the n-gram drafter looks up continuations
in the other open documents and in suggestions the user accepted, not only in the prompt. Its
index costs hundreds of bytes per token (``benchmarks/corpus_bench.py``), so the documents are
capped: each one contributes at most ``max_doc_tokens`` tokens (its beginning), and all together at most
``max_total_tokens``, the documents changed least recently dropped first.

Indexing runs on the decode worker (the drafter is not thread-safe) in background jobs, which
any request pre-empts between documents; a request never waits for it. The document being
completed is left out: the part of it near the cursor is the prompt itself, the drafter's live
stream, and re-indexing it on every keystroke would cost more than it drafts.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # decoding imports torch: the worker thread loads it
    from speculative_complete.decoding.drafter_interface import DocumentSources

log = logging.getLogger(__name__)

CHARS_PER_TOKEN_CAP = 8  # characters tokenized per token of budget: a generous upper bound


@dataclass
class DocumentSnapshot:
    version: int | None
    text: str


@dataclass
class DraftSources:
    max_doc_tokens: int = 8192
    max_total_tokens: int = 32768
    # uri -> (version, tokens indexed), least recently changed first
    _indexed: OrderedDict[str, tuple[int | None, int]] = field(default_factory=OrderedDict)
    _accepted: list[str] = field(default_factory=list)  # waiting to be indexed
    # The drafter indexed into, by weak reference: a new drafter (the setting changed, a model
    # reload) starts over, and an id() could be reused by one built where a freed one was.
    _drafter: weakref.ref | None = None
    accepted_tokens: int = 0  # indexed from accepted suggestions since the drafter was built

    # -- any thread (the event loop records, the worker indexes) -------------------------------------
    def accepted(self, text: str) -> None:
        """The user accepted ``text``; it is likely to be typed again elsewhere."""
        if text.strip():
            self._accepted.append(text)

    @property
    def total_tokens(self) -> int:
        return sum(tokens for _, tokens in self._indexed.values())

    def snapshot(self) -> dict[str, Any]:
        return {
            "documents": len(self._indexed),
            "tokens": self.total_tokens,
            "max_total_tokens": self.max_total_tokens,
            "accepted_tokens": self.accepted_tokens,
        }

    # -- worker side -------------------------------------------------------------------------------------
    def forget(self, uri: str) -> None:
        """``uri`` was closed (the drafter itself is told by its ``forget``): not indexed any more."""
        self._indexed.pop(uri, None)

    def sync(
        self,
        ngram: DocumentSources | None,
        documents: Mapping[str, DocumentSnapshot],
        exclude: str | None,
        encode: Callable[[str], Sequence[int]],
        should_stop: Callable[[], bool],
    ) -> int:
        """Bring ``ngram``'s extra sources in line with ``documents``; how many were (re)indexed.

        Stops between documents when ``should_stop`` says so; the rest is picked up next time.
        """
        if ngram is None:
            return 0
        if self._drafter is None or self._drafter() is not ngram:  # a new drafter: start over
            self._indexed.clear()
            self._drafter, self.accepted_tokens = weakref.ref(ngram), 0
        while self._accepted:
            tokens = encode(self._accepted.pop(0))
            ngram.add_accepted(tokens)
            self.accepted_tokens += len(tokens)
        for uri in [u for u in self._indexed if u not in documents or u == exclude]:
            ngram.remove_source(uri)
            del self._indexed[uri]
        changed = 0
        for uri, doc in documents.items():
            if uri == exclude or (uri in self._indexed and self._indexed[uri][0] == doc.version):
                continue
            if should_stop():
                break
            head = doc.text[: self.max_doc_tokens * CHARS_PER_TOKEN_CAP]
            tokens = list(encode(head))[: self.max_doc_tokens]
            ngram.set_source(uri, tokens)
            self._indexed[uri] = (doc.version, len(tokens))
            self._indexed.move_to_end(uri)
            changed += 1
        while self.total_tokens > self.max_total_tokens and self._indexed:
            uri, _ = self._indexed.popitem(last=False)
            ngram.remove_source(uri)
        return changed
