"""A completion request as one pipeline, from a position to an item.

    snapshot (event loop) -> prompt (worker: the runtime's tokenizer) -> decode (``EngineRuntime``)
    -> finish (post-processing) -> item

Each fact about a request is worked out once, on the event loop, into a ``Request`` that the
later steps read: the cursor, the language, where the suggestion may end (``Situation``), the
key its answer is remembered by. The handlers in ``server.py`` only translate LSP types.

Two checks answer without decoding, both in the same way: an identical request answered before
(greedy decoding would say the same again) and a cursor in the middle of a word. Each supersedes
what was running for the document, as a new decode would. When the worker falls idle after an
answer it works ahead (draft sources, prefetch, the workspace index): ``idle.py``'s ``IdleWork``,
which the service tells what happened. Per-document state lives in the owners that a
``DocumentRegistry`` forgets together.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

from speculative_complete.lsp_server import postprocess, request_log
from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import (
    ContextBuilder,
    ContextRequest,
    EditRing,
    OpenDocument,
    Prompt,
    detect,
)
from speculative_complete.lsp_server.context.languages import LanguageSpec
from speculative_complete.lsp_server.context.sticky_rows import Shown
from speculative_complete.lsp_server.documents import Cursor, PositionError, locate
from speculative_complete.lsp_server.idle import IdleWork
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.per_document import DocumentRegistry
from speculative_complete.lsp_server.postprocess import Situation
from speculative_complete.lsp_server.reuse import Key, SuggestionMemory
from speculative_complete.lsp_server.scheduler import Outcome, Scheduler
from speculative_complete.lsp_server.stats import ServerStats
from speculative_complete.lsp_server.workspace import WorkspaceIndex

if TYPE_CHECKING:
    from speculative_complete.decoding.results import GenerationResult

log = logging.getLogger(__name__)

ACCEPTED_COMMAND = "lsp_server.accepted"  # run by the client when the user accepts an item
_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True)
class Completion:
    text: str  # replaces ``range``: the cursor to the end of its line
    range: types.Range
    uri: str = ""

    def accepted_command(self) -> types.Command:
        """Tells the server what was accepted, so the n-gram drafter can draft it again."""
        return types.Command(
            title="lsp_server: suggestion accepted", command=ACCEPTED_COMMAND, arguments=[self.uri, self.text]
        )


@dataclass(frozen=True)
class Request:
    """One request, snapshotted on the event loop (documents keep changing there). Cheap: strings
    are shared, not copied, and only the lines around the cursor are looked at."""

    kind: str  # "inline" or "completion"
    uri: str
    cursor: Cursor
    source: str  # the document's text
    settings: Settings
    context: ContextRequest  # what the prompt is built from
    situation: Situation  # what post-processing and the suggestion's end need
    memory_key: Key  # with the prompt builder's state when the request came
    generation: int  # the document's in the registry: closed since, its answer is not remembered
    invoked: bool  # asked for explicitly (no debounce)

    @property
    def key(self) -> str:
        """The scheduler's key: one live decode per document and kind."""
        return f"{self.kind}:{self.uri}"


@dataclass(frozen=True)
class Times:
    """A request's clock (``time.monotonic()``), counted from its arrival: the latency the user sees."""

    deadline: float | None  # ``timeBudgetMs``: the runtime's rule for it (``finishes_first_line``)
    answer_by: float | None  # ``firstAnswerMs``: a block is answered with the lines it has


@dataclass
class Decoded:
    """A decode's result and the server-side time spent before the engine ran."""

    result: GenerationResult
    prompt_ms: float  # building the prompt: context, token counts, trimming to its budget
    prompt: Prompt
    context: Shown | None = None  # the prompt builder's state the build left (``ContextBuilder.state``)


class CompletionService:
    def __init__(
        self,
        host: ModelHost,
        scheduler: Scheduler,
        stats: ServerStats,
        settings: Callable[[], Settings],
        documents: Callable[[], Mapping[str, TextDocument]] = dict,
    ) -> None:
        self.host, self.scheduler, self.stats, self._settings = host, scheduler, stats, settings
        self._documents = documents
        self.memory = SuggestionMemory()
        self.context = ContextBuilder()  # builds prompts on the worker thread only
        self.registry = DocumentRegistry()
        self.registry.owner(self.memory.forget)
        self.registry.owner(host.forget)
        self.workspace = WorkspaceIndex()
        self.idle = IdleWork(
            host, scheduler, stats, self.registry, self.context, self.workspace, settings, documents
        )
        self.registry.owner(self.context.forget, worker=True)
        self.registry.owner(self.idle.sources.forget, worker=True)
        self.registry.owner(host.forget_on_worker, worker=True)
        self._forgetting: set[asyncio.Future] = set()  # worker jobs that free a closed document's state
        self.edits = EditRing()  # recently edited regions, for other documents' prompts

    async def complete(
        self, kind: str, uri: str, document: TextDocument | None, position: types.Position, *, invoked: bool
    ) -> Completion | None:
        """Answer one request; its log lines, here and on the worker, carry its id (``request_log``)."""
        with request_log.ensure_serving():
            return await self._serve(kind, uri, document, position, invoked)

    async def _serve(
        self, kind: str, uri: str, document: TextDocument | None, position: types.Position, invoked: bool
    ) -> Completion | None:
        """Every path counts exactly one answer (or re-raises after counting)."""
        started = time.monotonic()
        self.stats.requests += 1
        self.idle.request_came()
        try:
            completion, note = await self._complete(kind, uri, document, position, invoked)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            self._answered(kind, uri, position, started, "cancelled", empty=False)
            raise
        except JsonRpcException as exc:
            self.stats.errors += 1
            self._answered(kind, uri, position, started, f"error: {exc.message}", empty=False)
            raise
        except Exception:
            log.exception("%s request on %s failed", kind, uri)
            completion, note = None, self._failed("failed")
        self._answered(kind, uri, position, started, note, empty=completion is None)
        return completion

    def forget(self, uri: str) -> None:
        """The document was closed: nothing it held is kept, even if a decode for it is running."""
        for kind in ("inline", "completion"):  # nobody wants a completion for a closed document
            self.scheduler.supersede(f"{kind}:{uri}")
        self.idle.forget(uri)
        self.registry.forget(uri)
        # The worker's owners are told before its next job; this one frees memory if none comes.
        job = asyncio.ensure_future(
            self.scheduler.run_background(lambda stop: self.registry.forget_on_worker())
        )
        self._forgetting.add(job)
        job.add_done_callback(self._forgetting.discard)

    # -- the pipeline --------------------------------------------------------------------------------
    async def _complete(
        self, kind: str, uri: str, document: TextDocument | None, position: types.Position, invoked: bool
    ) -> tuple[Completion | None, str]:
        settings = self._settings()
        request, note = self._snapshot(kind, uri, document, position, settings, invoked)
        if request is None:
            return None, note
        if settings.type_ahead:
            found, text = self.memory.result(request.memory_key)
            if found:  # an identical request was answered before: greedy decoding would say the same
                self.stats.reuse["repeated"] += 1
                return self._answer_now(request, text, "repeated request")
        if _WORD_CHAR.match(request.situation.after[:1]):
            self.stats.mid_word += 1
            return self._answer_now(request, None, "mid-word (a word character follows the cursor)")
        typed_ahead = (
            settings.type_ahead
            and self.memory.typed_ahead(uri, request.source, request.cursor.offset) is not None
        )
        self.stats.reuse["typed_ahead"] += int(typed_ahead)
        arrived = time.monotonic()  # the budgets count from here, as the scheduler counts its own
        budget_s = settings.time_budget_ms / 1000 or None
        runtime = self.host.runtime
        # The local engine finishes the prefill and the first line (the runtime's own rule for the
        # budget); the scheduler's budget closes a request wherever it is, for a remote engine.
        hard_budget_s = None if runtime is not None and runtime.finishes_first_line else budget_s
        times = Times(
            deadline=arrived + budget_s if budget_s else None,
            answer_by=arrived + settings.first_answer_ms / 1000 if settings.first_answer_ms else None,
        )
        job = functools.partial(self._decode, request, asyncio.get_running_loop(), times)
        outcome = await self.scheduler.run(
            request.key,
            job,
            debounce_s=0.0 if invoked or typed_ahead else settings.debounce_ms / 1000,
            budget_s=hard_budget_s,
        )
        completion, note, final = self._finish(outcome, request)
        self._after_decode(request, outcome, completion, final)
        return completion, note

    def _snapshot(
        self,
        kind: str,
        uri: str,
        document: TextDocument | None,
        position: types.Position,
        settings: Settings,
        invoked: bool,
    ) -> tuple[Request | None, str]:
        """The request, or None and why there is nothing to decode."""
        if document is None:
            return None, "unknown document (not opened with didOpen)"
        try:
            cursor = locate(document, position)
        except PositionError as exc:
            raise JsonRpcInvalidParams(
                f"position {position.line}:{position.character} is out of range in {uri}: {exc}"
            ) from None
        if not settings.enabled:
            return None, "disabled"
        if not self.host.ready:
            return None, f"model {self.host.state.status}"
        text = document.source
        spec = detect(document.language_id, uri)
        context = self._context_request(uri, document, cursor.offset, settings, spec)
        situation = postprocess.situation_for(
            text, cursor.offset, cursor.before, cursor.after, spec, settings.multiline, settings.max_lines
        )
        shaping = (settings, self._other_versions(uri), context.recent_edits, self._symbols_version(settings))
        memory_key = self.memory.key(uri, text, cursor.offset, shaping, self.context.state(uri))
        return Request(
            kind,
            uri,
            cursor,
            text,
            settings,
            context,
            situation,
            memory_key,
            self.registry.touch(uri),
            invoked,
        ), ""

    def _context_request(
        self, uri: str, document: TextDocument, offset: int, settings: Settings, spec: LanguageSpec
    ) -> ContextRequest:
        """What the prompt builder gets: the document, the other open ones where snippets are on."""
        others = (
            tuple(OpenDocument(u, d.source, d.language_id) for u, d in self._documents().items() if u != uri)
            if settings.neighbor_snippets
            else ()
        )
        # transformers' generate() (the peer decoder) cannot honour a required prefix: no healing.
        heal = settings.token_healing and settings.decoder == "speculative"
        cross_file = settings.cross_file_context
        return ContextRequest(
            text=document.source,
            offset=offset,
            budget_tokens=settings.context_tokens,
            uri=uri,
            language_id=document.language_id,
            others=others,
            fim_template=settings.fim_template,
            neighbor_snippets=settings.neighbor_snippets,
            heal=heal,
            language=spec,
            cross_file=cross_file,
            symbols=self.workspace.symbols if cross_file else None,
            recent_edits=self.edits.others(uri) if cross_file else (),
        )

    def _symbols_version(self, settings: Settings) -> int:
        """The workspace's definitions shape the prompt: a new table is a new request identity."""
        return self.workspace.symbols_version if settings.cross_file_context else -1

    def edited(self, uri: str, line: int) -> None:
        """``uri`` changed at ``line`` (``didChange``): the region goes to the ring of recent edits."""
        document = self._documents().get(uri)
        if document is not None:
            self.edits.edited(uri, document.source, line)

    def _other_versions(self, uri: str) -> tuple:
        """Other documents can shape the prompt (snippets, draft sources): part of a request's identity."""
        return tuple((u, d.version) for u, d in self._documents().items() if u != uri)

    def _answer_now(self, request: Request, text: str | None, note: str) -> tuple[Completion | None, str]:
        """Answer without decoding; whatever ran for the document is stale now."""
        self.scheduler.supersede(request.key)
        self._remember(request, text, request.memory_key)
        self.idle.after_answer(request.uri, request.settings)
        return self._completion(text, request), note

    def _decode(
        self,
        request: Request,
        loop: asyncio.AbstractEventLoop,
        times: Times,
        should_stop: Callable[[], bool],
    ) -> Decoded | None:
        """On the worker: the prompt, with the tokenizer of the runtime that decodes it, and the
        decode. None when no model is loaded (it was unloaded meanwhile)."""
        self.registry.forget_on_worker()
        runtime = self.host.runtime
        if runtime is None:
            return None
        started = time.perf_counter()
        prompt = runtime.prompt(self.context, request.context, times.deadline)
        prompt_ms = (time.perf_counter() - started) * 1000
        log.debug(
            "%s %s: prompt of %d characters built in %.1f ms, decoding",
            request.kind,
            request.uri,
            len(prompt.text),
            prompt_ms,
        )
        context = self.context.state(request.uri)  # read here: the builder's thread
        result = runtime.generate(
            prompt,
            request.settings,
            request.situation.ending,
            should_stop,
            cache_key=request.uri,
            deadline=times.deadline,
            answer_by=times.answer_by,
        )
        loop.call_soon_threadsafe(self.stats.record_generation, result)  # counted even when superseded
        return Decoded(result, prompt_ms, prompt, context)

    def _finish(
        self, outcome: Outcome[Decoded | None], request: Request
    ) -> tuple[Completion | None, str, bool]:
        """The completion, a note for the log, and whether it is final (worth remembering)."""
        decoded = outcome.value
        if outcome.budget_exhausted:
            self.stats.budget_exhausted += 1
        if outcome.status == "superseded":
            self.stats.superseded += 1
            return None, "superseded", False
        if outcome.status == "failed":
            return None, self._failed(f"decode failed: {outcome.error}"), False
        if outcome.status != "done":  # expired in the queue, cancelled: the job never answered
            return None, outcome.status, False
        if decoded is None:
            return None, "model unloaded", False
        result = decoded.result
        post_started = time.perf_counter()
        text = postprocess.finish(result.text, request.situation)
        post_ms = (time.perf_counter() - post_started) * 1000
        s = result.stats
        self.stats.record_phases(
            queue_ms=outcome.queued_ms, prompt_ms=decoded.prompt_ms, stats=s, post_ms=post_ms
        )
        if s.target_passes == 0 and s.known_tokens > 0:
            self.stats.reuse["from_chain"] += 1
        for excerpt in decoded.prompt.snippets:
            self.stats.excerpts[excerpt.kind] += 1
        note = _decode_note(decoded, outcome)
        # a cut-short or failed decode (a remote engine's "error") is no answer to remember, nor
        # is a block answered early: asked again, the chain holds more of it by then
        final = not outcome.budget_exhausted and result.stop_reason not in ("cancelled", "error", "partial")
        if text is None:
            return None, f"nothing to suggest ({note})", final
        return self._completion(text, request), note, final

    def _after_decode(
        self,
        request: Request,
        outcome: Outcome[Decoded | None],
        completion: Completion | None,
        final: bool,
    ) -> None:
        """Remember the answer, then work ahead: the rest of a block answered early, or the usual
        idle-time work."""
        decoded = outcome.value
        shown = completion.text if completion is not None else None
        partial = decoded is not None and decoded.result.stop_reason == "partial"
        if final and decoded is not None:
            self._remember(request, shown, self._key_after(request, decoded))
        elif partial:
            self._remember(request, shown, None)  # on screen (typing along it), not a repeat's answer
        if outcome.status != "done":
            return
        ending = request.situation.ending
        asked = (request.context, ending)
        self.idle.after_answer(request.uri, request.settings, ending if partial else None, asked)

    def _key_after(self, request: Request, decoded: Decoded) -> Key | None:
        """The key an identical request will have after this decode: the prompt builder's state
        is the one this prompt left, which builds it again; None where it left none (the same
        request might then be given another prompt, so its answer is not kept for one)."""
        if decoded.context is None:
            return None
        return self.memory.with_context(request.memory_key, decoded.context)

    def _remember(self, request: Request, text: str | None, key: Key | None) -> None:
        """Keep the answer for an identical request (under ``key``; None: only as the suggestion
        on screen), unless the document was closed meanwhile."""
        if request.settings.type_ahead and self.registry.current(request.uri, request.generation):
            self.memory.remember(key, request.uri, request.source, request.cursor.offset, text)

    def _failed(self, note: str) -> str:
        self.stats.failed += 1
        return note

    @staticmethod
    def _completion(text: str | None, request: Request) -> Completion | None:
        if text is None:
            return None
        cursor = request.cursor
        return Completion(text, types.Range(cursor.start_position(), cursor.line_end_position()), request.uri)

    def accepted(self, uri: str, text: str) -> None:
        """The client ran the accepted-item command."""
        self.stats.reuse["accepted"] += 1
        self.idle.accepted(text)

    def _answered(
        self, kind: str, uri: str, position: types.Position, started: float, note: str, *, empty: bool
    ) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        self.stats.answer(latency_ms, empty=empty)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s %s %d:%d -> %s in %.0f ms: %s",
                kind,
                uri,
                position.line,
                position.character,
                "empty" if empty else "answer",
                latency_ms,
                note,
            )


def _decode_note(decoded: Decoded, outcome: Outcome[Any]) -> str:
    """How a decode went, for the debug log."""
    result, s = decoded.result, decoded.result.stats
    budget = " (budget)" if outcome.budget_exhausted else ""
    after_tokens, after_passes = s.after_prefill
    after = f"{after_tokens / after_passes:.2f}" if after_passes else "-"
    return (
        f"{result.stop_reason}{budget}, {s.new_tokens} tokens, "
        f"{s.target_passes} passes, {s.tokens_per_pass:.2f}/pass ({after} after the prefill), "
        f"prompt {s.prompt_tokens} "
        f"({s.reused_tokens} reused, {s.known_tokens} known), healed {decoded.prompt.healed!r}, "
        f"queued {outcome.queued_ms:.0f} ms, prefill {s.prefill_ms:.0f} ms, draft {s.draft_ms:.0f} ms, "
        f"verify {s.verify_ms:.0f} ms, decode {s.decode_ms:.0f} ms, drafted "
        f"{sum(d.proposed for d in s.drafters.values())}"
    )
