"""Idle-time work: what the decode worker does between requests, and when.

Two kinds, on a runtime that ``works_ahead`` only (the local engine: a remote one keeps nothing here
to work on), all as the scheduler's background jobs, which any request pre-empts within one engine
step:

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
document closed) and the model host only says which runtime is loaded. What working ahead does to
a runtime's caches is the runtime's (``EngineRuntime``: ``draft_indexing``, ``decode_ahead``,
``renew``): this module decides only when, and for which document.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from pygls.workspace import TextDocument

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.per_document import DocumentRegistry
from speculative_complete.lsp_server.runtime_interface import EngineRuntime
from speculative_complete.lsp_server.scheduler import Scheduler
from speculative_complete.lsp_server.sources import DocumentSnapshot, DraftSources
from speculative_complete.lsp_server.stats import ServerStats
from speculative_complete.lsp_server.workspace import WorkspaceIndex

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from speculative_complete.decoding.results import GenerationResult

IDLE_BEFORE_BACKGROUND_S = 0.15  # a typist's next key usually comes sooner: don't start work to drop
IDLE_BEFORE_INDEXING_S = 0.5  # the workspace index waits for a real pause, after any prefetch


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
        while self.workspace.pending and self._working_runtime(self._settings()) is not None:
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
    def _working_runtime(self, settings: Settings) -> EngineRuntime | None:
        """The loaded runtime, if idle-time work has anything to work on in it."""
        runtime = self.host.runtime
        return runtime if runtime is not None and runtime.works_ahead(settings) else None

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
        again on rows chosen again (``renew``), else the line after the suggestion. Returns what
        was decoded and whether the document took rows chosen again, or None when nothing was
        decoded."""
        self.registry.forget_on_worker()
        runtime = self._working_runtime(settings)
        if runtime is None:
            return None
        indexing = runtime.draft_indexing(settings)
        if indexing is not None:
            self.sources.sync(indexing.sources, documents, uri, indexing.encode, should_stop)
        if uri is None or should_stop():
            return None
        self.prefetching = True
        try:
            if rest is None and settings.prefetch and asked and self.context.needs_renewal(uri):
                request, ending = asked
                renewal = runtime.renew(self.context, request, ending, settings, should_stop)
                return None if renewal is None else (renewal.result, renewal.adopted)
            result = runtime.decode_ahead(uri, settings, should_stop, rest)
            return None if result is None else (result, False)
        finally:
            self.prefetching = False

    def _index_job(self, should_stop: Callable[[], bool]) -> bool | None:
        self.registry.forget_on_worker()
        settings = self._settings()
        runtime = self._working_runtime(settings)
        indexing = runtime.draft_indexing(settings) if runtime is not None else None
        if indexing is None:
            return None  # no runtime to work in, or no n-gram drafter to index for
        return self.workspace.sync(indexing.sources, indexing.encode, should_stop)
