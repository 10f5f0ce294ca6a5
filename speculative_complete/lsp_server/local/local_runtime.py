"""``LocalRuntime``: the runtime (``speculative_complete.lsp_server.runtime_interface``) on the local engine.

What one successful load produced (``loading.py``): the speculative engine with its per-document
KV caches and greedy chains (``PrefixCache``), the drafter, and the target's tokenizer for the
prompt. It is used on the scheduler's worker thread only, the one thread that ever touches the
engine and its drafter; ``decoding`` (torch) is imported inside its methods, never at import.
What it asks the engine to decode is ``generation.py``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest, Prompt, Tokens
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.local import generation
from speculative_complete.lsp_server.local.generation import keeps_chains
from speculative_complete.lsp_server.runtime_interface import DraftIndexing, Renewal

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from speculative_complete.decoding import GenerationResult, LoadedModel, SpeculativeEngine
    from speculative_complete.decoding.drafter_interface import DocumentSources
    from speculative_complete.decoding.drafters import Drafter, HeadDrafter
    from speculative_complete.decoding.engine.transformers_peer import TransformersDecoder
    from speculative_complete.decoding.kv_cache import Chain, PrefixCache

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
        newer keystroke or a cancel: the budget never stops the prefill or cuts a line
        (``generation.for_request``)."""
        engine = self.engine
        self.fit_caches(settings.kv_cache_mb * MB)
        config = generation.for_request(settings, prompt, ending, cache_key, deadline, answer_by)
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

    # -- idle-time work ------------------------------------------------------------------------------
    def works_ahead(self, settings: Settings) -> bool:
        """The speculative engine keeps chains and draft sources; the transformers peer does not."""
        return settings.decoder == "speculative"

    def draft_indexing(self, settings: Settings) -> DraftIndexing | None:
        self.drafter_for(settings.drafter)  # the drafter requests will use, built if new
        sources = self.ngram_source()
        return None if sources is None else DraftIndexing(sources, self.engine.encode)

    def decode_ahead(
        self, uri: str, settings: Settings, should_stop: Callable[[], bool], rest: Ending | None = None
    ) -> GenerationResult | None:
        """On from the end of ``uri``'s greedy chain, under ``uri``'s cache key
        (``generation.ahead`` says how far)."""
        if not keeps_chains(settings, uri):
            return None
        engine = self.engine
        chain = engine.prefix_cache.chain(uri)
        if chain is None or chain.greedy_from is None:
            return None
        asked, owed = _asked_at(chain)
        past = engine.decode(chain.tokens[asked:]).removeprefix(owed)
        config = generation.ahead(settings, past, len(chain.tokens) - asked, rest)
        if config is None:
            return None
        drafter = self.drafter_for(settings.drafter)
        return engine.generate(chain.tokens, config, drafter, cancel=should_stop, cache_key=uri)

    def renew(
        self,
        builder: ContextBuilder,
        request: ContextRequest,
        ending: Ending,
        settings: Settings,
        should_stop: Callable[[], bool],
    ) -> Renewal | None:
        """The renewed prompt goes under a cache key of its own (``renewal_key``), so that the
        document's cache goes on serving keystrokes on the old rows until the new prompt is whole
        in the cache; then the document adopts both, and the next keystroke keeps the new rows.
        Pre-empted, what was prefilled waits for the next pause's renewal to go on from."""
        uri = request.uri
        if not keeps_chains(settings, uri):
            return None
        prompt = self.prompt(builder, replace(request, renew_rows=True), None)
        result = self.generate(
            prompt, settings, ending, should_stop, cache_key=renewal_key(uri), answer_by=time.monotonic()
        )
        cache = self.engine.prefix_cache
        adopted = uri in builder.renewing and cache.adopt(renewal_key(uri), uri, prompt.ids)
        if adopted:
            builder.adopt_renewal(uri)
        log.debug(
            "%s: rows renewed, prompt %d (%d reused), %s, %s",
            uri,
            len(prompt.ids),
            result.stats.reused_tokens,
            result.stop_reason,
            "adopted" if adopted else "not adopted yet",
        )
        return Renewal(result, adopted)

    # -- caches --------------------------------------------------------------------------------------
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
        from speculative_complete.decoding.drafters import AutoDrafter, ModelDrafter

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
            from speculative_complete.decoding.drafters import make_drafter

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
            from speculative_complete.decoding.engine.transformers_peer import TransformersDecoder

            self._peer = TransformersDecoder(self.engine, self.draft_model)
        return self._peer


def renewal_key(uri: str) -> str:
    """The KV cache key a document's renewed prompt is prefilled under (``LocalRuntime.renew``), apart
    from the document's own cache, which keeps serving its keystrokes until it is adopted."""
    return f"renewal:{uri}"


def _asked_at(chain: Chain) -> tuple[int, str]:
    """Where the user's text ends on the chain: the last prompt's length and its healed text
    (which may itself hold a line end: a line start is healed)."""
    if chain.asked is not None and chain.asked.prompt_tokens <= len(chain.tokens):
        return chain.asked.prompt_tokens, chain.asked.owed
    return chain.greedy_from or len(chain.tokens), ""
