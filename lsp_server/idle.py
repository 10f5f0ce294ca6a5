"""Idle-time work: what the decode worker does between requests, and when.

Two kinds, both on the local engine only (a remote one keeps nothing here to work on), all as the
scheduler's background jobs, which any request pre-empts within one engine step:

- after an answer, index changed open documents as the n-gram drafter's sources (``DraftSources``)
  and decode ahead on the document's greedy chain: the rest of a block answered early, at once
  (the user is reading its first lines), else the line after the suggestion after a short pause
  (``prefetch``), so that accepting it and moving on is answered at once; or, where the prompt's
  rows have little room left (``ContextBuilder.needs_renewal``), choose them again and prefill
  the new prompt at that pause, which the next line would else make a keystroke do;
- the workspace index (``workspace.py``) is brought up to date at a longer pause.

Only the latest answer's plan is worth doing: a new plan cancels the one before, and work planned
before a request came in is dropped. One owner for both the when and the what keeps those rules in
one place; ``CompletionService`` tells it what happened (a request came, an answer went out, a
document closed) and the model host only says which runtime is loaded.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pygls.workspace import TextDocument

from lsp_server.config import Settings
from lsp_server.context import ContextBuilder, ContextRequest
from lsp_server.ending import Ending
from lsp_server.local.runtime import LocalRuntime, keeps_chains, renewal_key
from lsp_server.model_host import ModelHost
from lsp_server.per_document import DocumentRegistry
from lsp_server.scheduler import Scheduler
from lsp_server.sources import DocumentSnapshot, DraftSources
from lsp_server.stats import ServerStats
from lsp_server.workspace import WorkspaceIndex

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from decoding import GenerationConfig, SpeculativeEngine
    from decoding.kv_cache import Chain
    from decoding.results import GenerationResult

log = logging.getLogger(__name__)

IDLE_BEFORE_BACKGROUND_S = 0.15  # a typist's next key usually comes sooner: don't start work to drop
IDLE_BEFORE_INDEXING_S = 0.5  # the workspace index waits for a real pause, after any prefetch
PREFETCH_LINES = 2  # the chain may run this many line ends past the prompt before prefetch stops


class IdleWork:
    """Plans, runs and counts the worker's idle-time jobs; event loop, except the ``_job``s."""

    def __init__(
        self,
        host: ModelHost,
        scheduler: Scheduler,
        stats: ServerStats,
        registry: DocumentRegistry,
        context: ContextBuilder,
        workspace: WorkspaceIndex,
        settings: Callable[[], Settings],
        documents: Callable[[], Mapping[str, TextDocument]],
    ) -> None:
        self.host, self.scheduler, self.stats, self.registry = host, scheduler, stats, registry
        self.context = context  # the service's prompt builder: the worker's, as a renewal's prompt is
        self.workspace = workspace
        self._settings, self._documents = settings, documents
        self.sources = DraftSources()  # other open documents and accepted text, for the n-gram drafter
        self.prefetching = False  # a decode ahead is running on the worker (shown in the stats)
        self._requests_seen = 0  # background work starts only if no request came in meanwhile
        self._planned: asyncio.Task | None = None
        self._planned_uri: str | None = None
        self._indexing: asyncio.Task | None = None

    # -- what happened (event loop) ------------------------------------------------------------------
    def request_came(self) -> None:
        """A request arrived: work planned before it is stale once it gets to run."""
        self._requests_seen += 1

    def forget(self, uri: str) -> None:
        """``uri`` was closed: the plan made for it is dropped, and its job stopped if running."""
        if self._planned_uri == uri and self._planned is not None:
            self._planned.cancel()  # its prefetch is for this document
            self.scheduler.preempt_background()

    def accepted(self, text: str) -> None:
        """The user accepted ``text``: the n-gram drafter may draft it again."""
        self.sources.accepted(text)

    def after_answer(
        self,
        uri: str,
        settings: Settings,
        rest: Ending | None = None,
        asked: tuple[ContextRequest, Ending] | None = None,
    ) -> None:
        """Work ahead after an answer; ``rest``: the ending of a block answered early, whose rest
        is decoded at once (the user is reading its first lines), not after a pause; ``asked``:
        the request answered, whose rows may be chosen again at the pause."""
        self._plan(uri, self._work_ahead(uri, settings, self._requests_seen, rest, asked))
        if self.workspace.pending:  # e.g. the drafter setting changed: a new drafter, no index yet
            self.index_workspace()

    def index_workspace(self) -> None:
        """Bring the workspace index up to date when the worker is idle (files changed, a model
        loaded); one such task at a time."""
        if self._indexing is None or self._indexing.done():
            self._indexing = asyncio.ensure_future(self._index_when_idle())

    # -- when ---------------------------------------------------------------------------------------
    def _plan(self, uri: str, work: Coroutine[Any, Any, None]) -> None:
        """Make ``work`` the idle-time work: for the latest answer only, earlier plans are stale."""
        if self._planned is not None:
            self._planned.cancel()
        self._planned_uri = uri
        self._planned = asyncio.ensure_future(work)

    async def _work_ahead(
        self,
        uri: str,
        settings: Settings,
        seen: int,
        rest: Ending | None,
        asked: tuple[ContextRequest, Ending] | None,
    ) -> None:
        if rest is None:
            await asyncio.sleep(IDLE_BEFORE_BACKGROUND_S)
        if self._requests_seen != seen or not self.host.ready:
            return  # the user typed on: the next answer will bring us back here
        documents = {u: DocumentSnapshot(d.version, d.source) for u, d in self._documents().items()}
        outcome = await self.scheduler.run_background(
            functools.partial(self._ahead_job, settings, documents, uri, rest, asked)
        )
        if outcome.value is not None:  # kept apart from the request decodes' counters
            result, renewed = outcome.value
            self.stats.record_prefetch(result)
            self.stats.prefetch["rests"] += int(rest is not None)
            self.stats.prefetch["renewed"] += int(renewed)
        elif outcome.status == "superseded":
            self.stats.prefetch["preempted"] += 1

    async def _index_when_idle(self) -> None:
        while self.workspace.pending and self.host.local is not None:
            seen = self._requests_seen
            await asyncio.sleep(IDLE_BEFORE_INDEXING_S)
            if self._requests_seen != seen:
                continue  # the user is typing: try again at the next pause
            outcome = await self.scheduler.run_background(self._index_job)
            if outcome.status in ("cancelled", "failed") or (
                outcome.status == "done" and outcome.value is None
            ):
                return  # the server is stopping, a bug (logged), or no n-gram drafter to index for

    # -- what (worker) ------------------------------------------------------------------------------
    def _ahead_job(
        self,
        settings: Settings,
        documents: dict[str, DocumentSnapshot],
        uri: str | None,
        rest: Ending | None,
        asked: tuple[ContextRequest, Ending] | None,
        should_stop: Callable[[], bool],
    ) -> tuple[GenerationResult, bool] | None:
        """Index changed documents as draft sources, then decode ahead on ``uri``'s greedy chain:
        the rest of a block answered early (``rest``: its ending), else the request answered
        again on rows chosen again (``_renew``), else the line after the suggestion. Returns what
        was decoded and whether the document took rows chosen again, or None when nothing was
        decoded."""
        self.registry.forget_on_worker()
        runtime = self.host.local
        if runtime is None or settings.decoder != "speculative":
            return None
        engine = runtime.engine
        drafter = runtime.drafter_for(settings.drafter)
        self.sources.sync(runtime.ngram_source(), documents, uri, engine.encode, should_stop)
        if uri is None or not keeps_chains(settings, uri) or should_stop():
            return None
        if rest is None and settings.prefetch and asked and self.context.needs_renewal(uri):
            return self._renew(runtime, settings, uri, asked, should_stop)
        chain = engine.prefix_cache.chain(uri)
        if chain is None or chain.greedy_from is None:
            return None
        from decoding import GenerationConfig

        if rest is not None:
            config = _rest_of_block(engine, chain, rest, settings.max_new_tokens)
        elif settings.prefetch and _past_asked(engine, chain).count("\n") < PREFETCH_LINES:
            config = GenerationConfig(
                max_new_tokens=settings.max_new_tokens, stop_at_newline=True, ahead=True
            )
        else:
            return None  # not wanted, or already decoded ahead
        if config is None:
            return None  # the chain already reaches the block's end
        self.prefetching = True
        try:
            return engine.generate(chain.tokens, config, drafter, cancel=should_stop, cache_key=uri), False
        finally:
            self.prefetching = False

    def _renew(
        self,
        runtime: LocalRuntime,
        settings: Settings,
        uri: str,
        asked: tuple[ContextRequest, Ending],
        should_stop: Callable[[], bool],
    ) -> tuple[GenerationResult, bool]:
        """The request answered last, on rows chosen again (``ContextRequest.renew_rows``): its
        prompt prefilled and decoded now under a cache key of its own (``renewal_key``), so that
        the document's cache goes on serving keystrokes on the old rows until the new prompt is
        whole in the cache; then the document adopts both, and the next keystroke keeps the new
        rows. Pre-empted, what was prefilled waits for the next pause's renewal to go on from."""
        request, ending = asked
        prompt = runtime.prompt(self.context, replace(request, renew_rows=True), None)
        self.prefetching = True
        try:
            result = runtime.generate(
                prompt, settings, ending, should_stop, cache_key=renewal_key(uri), answer_by=time.monotonic()
            )
        finally:
            self.prefetching = False
        cache = runtime.engine.prefix_cache
        adopted = uri in self.context.renewing and cache.adopt(renewal_key(uri), uri, prompt.ids)
        if adopted:
            self.context.adopt_renewal(uri)
        log.debug(
            "%s: rows renewed, prompt %d (%d reused), %s, %s",
            uri,
            len(prompt.ids),
            result.stats.reused_tokens,
            result.stop_reason,
            "adopted" if adopted else "not adopted yet",
        )
        return result, adopted

    def _index_job(self, should_stop: Callable[[], bool]) -> bool | None:
        self.registry.forget_on_worker()
        runtime, settings = self.host.local, self._settings()
        if runtime is None or settings.decoder != "speculative":
            return None
        runtime.drafter_for(settings.drafter)  # the drafter requests will use, built if new
        ngram = runtime.ngram_source()
        return None if ngram is None else self.workspace.sync(ngram, runtime.engine.encode, should_stop)


def _asked_at(chain: Chain) -> tuple[int, str]:
    """Where the user's text ends on the chain: the last prompt's length and its healed text
    (which may itself hold a line end: a line start is healed)."""
    if chain.asked is not None and chain.asked.prompt_tokens <= len(chain.tokens):
        return chain.asked.prompt_tokens, chain.asked.owed
    return chain.greedy_from or len(chain.tokens), ""


def _past_asked(engine: SpeculativeEngine, chain: Chain) -> str:
    """The text the greedy chain holds past what the user has typed."""
    asked, owed = _asked_at(chain)
    return engine.decode(chain.tokens[asked:]).removeprefix(owed)


def _rest_of_block(
    engine: SpeculativeEngine, chain: Chain, ending: Ending, max_new_tokens: int
) -> GenerationConfig | None:
    """How to decode on from where the chain ends to where a block answered early ends, within
    the tokens the request itself could have decoded; None when the chain already reaches the
    block's end (or the token limit)."""
    from decoding import GenerationConfig

    so_far = _past_asked(engine, chain)
    asked, _ = _asked_at(chain)
    remaining = max_new_tokens - (len(chain.tokens) - asked)
    if remaining <= 0 or ending.cut(so_far) is not None:
        return None

    def block_end(text: str) -> int | None:
        cut = ending.cut(so_far + text)
        return None if cut is None else max(0, cut - len(so_far))

    return GenerationConfig(max_new_tokens=remaining, stop_when=block_end, ahead=True)
