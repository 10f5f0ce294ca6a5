"""``LocalRuntime``: the request pipeline's runtime (``lsp_server.runtime``) on the local engine.

What one successful load produced (``loading.py``): the speculative engine with its per-document
KV caches and greedy chains (``PrefixCache``), the drafter, and the target's tokenizer for the
prompt. It is used on the scheduler's worker thread only, the one thread that ever touches the
engine and its drafter; ``decoding`` (torch) is imported inside its methods, never at import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lsp_server.config import Settings
from lsp_server.context import ContextBuilder, ContextRequest, Prompt, Tokens
from lsp_server.ending import Ending

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from decoding import GenerationResult, LoadedModel, SpeculativeEngine
    from decoding.drafter_interface import DocumentSources
    from decoding.drafters import Drafter, HeadDrafter
    from decoding.engine.transformers_peer import TransformersDecoder
    from decoding.kv_cache import PrefixCache

log = logging.getLogger(__name__)

MB = 1 << 20


@dataclass
class LocalRuntime:
    """What one successful load produced: an engine that decodes a prompt into a suggestion.
    Used on the worker thread only; a request holds on to one runtime from its prompt to its
    answer, so the ids it is fed always come from the tokenizer of the model that decodes them."""

    engine: SpeculativeEngine  # with its PrefixCache: per document, the KV cache and greedy chain
    drafter: Drafter | None
    drafter_name: str
    draft_model: LoadedModel | None
    draft_head: HeadDrafter | None
    tokens: Tokens  # the target's tokenizer, for building prompts
    kv_cache_bytes: int = 0  # ``kvCacheMb`` as last applied: both models' KV caches together
    draft_kv_share: float = 0.0  # of that, the draft model's per-document caches' (``kv_share``)
    _peer: TransformersDecoder | None = None  # built on first use
    kind: ClassVar[str] = "local"
    finishes_first_line: ClassVar[bool] = True

    def prompt(self, builder: ContextBuilder, request: ContextRequest, deadline: float | None) -> Prompt:
        """Exact and instant: the engine's own tokenizer (the deadline is the decode's business)."""
        return builder.build(request, self.tokens)

    def generate(
        self,
        prompt: Prompt,
        settings: Settings,
        ending: Ending,
        should_stop: Callable[[], bool],
        cache_key: str | None = None,
        deadline: float | None = None,
        answer_by: float | None = None,
    ) -> GenerationResult:
        """Decode after ``prompt`` until ``ending`` says the suggestion is over; ``cache_key`` (the
        document) selects the KV cache and greedy chain to reuse and keep. ``should_stop`` is a
        newer keystroke or a cancel: the budget never stops the prefill or cuts a line. A
        multi-line body is answered with its whole lines from ``answer_by`` on, where the chain
        keeps the rest, and from ``deadline`` on in any case."""
        from decoding import GenerationConfig

        engine = self.engine
        self.fit_caches(settings.kv_cache_mb * MB)
        config = GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            stop_at_newline=ending.stop_at_newline,
            reuse_continuation=settings.type_ahead,
            required_prefix=prompt.healed,
            stop_strings=prompt.stop_strings,
            stop_when=ending.cut if ending.multiline else None,
            answer_due=_due_at(_earliest(answer_by if keeps_chains(settings, cache_key) else None, deadline))
            if ending.multiline
            else None,
        )
        ids = list(prompt.ids)
        if settings.decoder == "transformers":
            return self.peer().generate(ids, config, settings.drafter, cancel=should_stop)
        return engine.generate(
            ids,
            config,
            self.drafter_for(settings.drafter),
            cancel=should_stop,
            cache_key=cache_key if settings.kv_cache_mb > 0 else None,
        )

    @property
    def draft_cache_bytes(self) -> int:
        """The draft model's per-document KV caches' part of ``kv_cache_bytes``."""
        return int(self.kv_cache_bytes * self.draft_kv_share)

    def fit_caches(self, total_bytes: int) -> None:
        """Bound both models' per-document KV caches by ``total_bytes`` together (``kvCacheMb``,
        which may change between requests): the draft model's take their share, the target's
        the rest, and each evicts down to its part at once (worker thread)."""
        self.kv_cache_bytes = max(0, int(total_bytes))
        self.engine.prefix_cache.resize(self.kv_cache_bytes - self.draft_cache_bytes)
        sessions = self._draft_sessions()
        if sessions is not None:
            sessions.resize(self.draft_cache_bytes)

    def _draft_sessions(self) -> PrefixCache | None:
        """The draft model's per-document caches, if the drafter has a draft model (alone or in
        ``auto``)."""
        from decoding.drafters import AutoDrafter, ModelDrafter

        drafter = self.drafter
        model = drafter.model if isinstance(drafter, AutoDrafter) else drafter
        return model.sessions if isinstance(model, ModelDrafter) else None

    def forget(self, uri: str) -> None:
        """``uri`` was closed: the drafter drops its sources and caches for it (worker thread)."""
        if self.drafter is not None:
            self.drafter.forget(uri)

    def close(self) -> None:
        """Nothing to release by hand: the weights go with the last reference."""

    def snapshot(self) -> dict[str, Any] | None:
        return None

    def drafter_for(self, name: str) -> Drafter | None:
        """The drafter named ``name``; built once and kept, because it learns across requests."""
        if name != self.drafter_name:
            from decoding.drafters import make_drafter

            build = name
            if name == "head" and self.draft_head is None:
                log.warning("drafter 'head': no draft head for this model (draftHead); using auto")
                build = "auto"
            self.drafter = make_drafter(
                build,
                draft_model=self.draft_model,
                draft_head=self.draft_head,
                cost=self.engine.cost,
                session_cache_bytes=self.draft_cache_bytes,
                target_vocab=self.engine.target.vocab_size,
            )
            self.drafter_name = name
        return self.drafter

    def ngram_source(self) -> DocumentSources | None:
        """The n-gram drafter that takes other open documents as sources, if the drafter has one.
        Not thread-safe: call it on the worker thread only."""
        return self.drafter.document_sources() if self.drafter is not None else None

    def peer(self) -> TransformersDecoder:
        if self._peer is None:
            from decoding.engine.transformers_peer import TransformersDecoder

            self._peer = TransformersDecoder(self.engine, self.draft_model)
        return self._peer


def renewal_key(uri: str) -> str:
    """The KV cache key a document's renewed prompt is prefilled under (``idle._renew``), apart
    from the document's own cache, which keeps serving its keystrokes until it is adopted."""
    return f"renewal:{uri}"


def keeps_chains(settings: Settings, cache_key: str | None) -> bool:
    """Whether a document's greedy chain is kept and answers the next request from it: what an
    early answer relies on to hand the rest of a block to the next request."""
    return (
        cache_key is not None
        and settings.kv_cache_mb > 0
        and settings.type_ahead
        and settings.decoder == "speculative"
    )


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


def _due_at(answer_by: float | None) -> Callable[[float], bool] | None:
    """The engine's ``answer_due`` check for a first answer due at ``answer_by``: due once a pass
    of the given milliseconds, started now, would end past it."""
    if answer_by is None:
        return None
    return lambda next_pass_ms: time.monotonic() + next_pass_ms / 1000 >= answer_by
