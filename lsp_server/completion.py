"""From a request (document, position, trigger) to an insert text and a range, with the bookkeeping.

The handlers in ``server.py`` stay thin: they look up the document and translate to and from LSP
types; this module decides whether to decode at all (enabled, model ready, an identical request
answered before), builds the prompt, schedules the decode (debounce, supersede, budget),
post-processes it, counts the outcome, and when the worker falls idle lets it work ahead
(draft sources, prefetch).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

from lsp_server import languages, postprocess
from lsp_server.config import Settings
from lsp_server.context import ContextBuilder, ContextRequest
from lsp_server.documents import Cursor, PositionError, locate
from lsp_server.model_host import Decoded, ModelHost
from lsp_server.postprocess import Situation
from lsp_server.reuse import SuggestionMemory
from lsp_server.scheduler import Outcome, Scheduler
from lsp_server.snippets import OpenDocument
from lsp_server.sources import DocumentSnapshot
from lsp_server.stats import ServerStats

log = logging.getLogger(__name__)

ACCEPTED_COMMAND = "lsp_server.accepted"  # run by the client when the user accepts an item
IDLE_BEFORE_BACKGROUND_S = 0.15  # a typist's next key usually comes sooner: don't start work to drop
_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True)
class Completion:
    text: str  # replaces ``range``: the cursor to the end of its line
    range: types.Range
    uri: str = ""

    def accepted_command(self) -> types.Command:
        """Tells the server what was accepted, so the n-gram drafter can draft it again."""
        return types.Command(title="lsp_server: suggestion accepted", command=ACCEPTED_COMMAND,
                             arguments=[self.uri, self.text])


class CompletionService:
    def __init__(self, host: ModelHost, scheduler: Scheduler, stats: ServerStats,
                 settings: Callable[[], Settings],
                 documents: Callable[[], Mapping[str, TextDocument]] = dict) -> None:
        self.host, self.scheduler, self.stats, self._settings = host, scheduler, stats, settings
        self._documents = documents
        self.memory = SuggestionMemory()
        self._requests_seen = 0  # background work starts only if no request came in meanwhile
        self._background: asyncio.Task | None = None
        self.context = ContextBuilder()  # builds prompts on the worker thread only

    async def complete(self, kind: str, uri: str, document: TextDocument | None, position: types.Position,
                       *, invoked: bool) -> Completion | None:
        """Answer one request; every path counts exactly one answer (or re-raises after counting)."""
        started = time.monotonic()
        self.stats.requests += 1
        self._requests_seen += 1
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
            self.stats.failed += 1
            completion, note = None, "failed"
        self._answered(kind, uri, position, started, note, empty=completion is None)
        return completion

    def forget(self, uri: str) -> None:
        """The document was closed."""
        self.memory.forget(uri)
        self.host.forget(uri)

    async def _complete(self, kind: str, uri: str, document: TextDocument | None, position: types.Position,
                        invoked: bool) -> tuple[Completion | None, str]:
        settings = self._settings()
        if document is None:
            return None, "unknown document (not opened with didOpen)"
        try:
            cursor = locate(document, position)
        except PositionError as exc:
            raise JsonRpcInvalidParams(
                f"position {position.line}:{position.character} is out of range in {uri}: {exc}") from None
        if not settings.enabled:
            return None, "disabled"
        if not self.host.ready:
            return None, f"model {self.host.state.status}"
        source = document.source
        memory_key = self.memory.key(uri, source, cursor.offset, (settings, self._other_versions(uri)))
        typed_ahead = False
        if settings.type_ahead:
            found, text = self.memory.result(memory_key)
            if found:  # an identical request was answered before: greedy decoding would say the same
                self.scheduler.supersede(f"{kind}:{uri}")  # whatever ran there is stale now
                self.stats.reuse["repeated"] += 1
                self._after_answer(uri, settings)
                return self._completion(text, cursor, uri), "repeated request"
            typed_ahead = self.memory.typed_ahead(uri, source, cursor.offset) is not None
            self.stats.reuse["typed_ahead"] += int(typed_ahead)
        request, situation = self._snapshot(uri, document, cursor, settings)
        outcome = await self.scheduler.run(
            f"{kind}:{uri}", self._job(request, situation, settings, uri),
            debounce_s=0.0 if invoked or typed_ahead else settings.debounce_ms / 1000,
            budget_s=settings.time_budget_ms / 1000 or None)
        completion, note, final = self._finish(outcome, cursor, situation, uri)
        if final and settings.type_ahead:
            self.memory.remember(memory_key, uri, source, cursor.offset,
                                 completion.text if completion is not None else None)
        if outcome.status == "done":
            self._after_answer(uri, settings)
        return completion, note

    def _other_versions(self, uri: str) -> tuple:
        """Other documents can shape the prompt (snippets, draft sources): part of a request's identity."""
        return tuple((u, d.version) for u, d in self._documents().items() if u != uri)

    def _snapshot(self, uri: str, document: TextDocument, cursor: Cursor,
                  settings: Settings) -> tuple[ContextRequest, Situation]:
        """What the worker needs, taken now (documents keep changing on the event loop). Cheap:
        strings are shared, not copied, and only the lines around the cursor are looked at."""
        text = document.source
        spec = languages.detect(document.language_id, uri)
        others = tuple(OpenDocument(u, d.source, d.language_id) for u, d in self._documents().items()
                       if u != uri) if settings.neighbor_snippets else ()
        # transformers' generate() (the peer decoder) cannot honour a required prefix: no healing.
        heal = settings.token_healing and settings.decoder == "speculative"
        request = ContextRequest(text=text, offset=cursor.offset, budget_tokens=settings.context_tokens,
                                 uri=uri, language_id=document.language_id, others=others,
                                 fim_template=settings.fim_template,
                                 neighbor_snippets=settings.neighbor_snippets, heal=heal)
        situation = postprocess.situation_for(text, cursor.offset, cursor.before, cursor.after, spec,
                                              settings.multiline, settings.max_lines)
        return request, situation

    def _job(self, request: ContextRequest, situation: Situation, settings: Settings,
             uri: str) -> Callable[[Callable[[], bool]], Any]:
        loop = asyncio.get_running_loop()
        end = situation.ending

        def job(should_stop: Callable[[], bool]) -> Decoded | None:
            # Checked here, not before scheduling, so the request still supersedes the decode
            # running for an older keystroke, like any other.
            if _WORD_CHAR.match(situation.after[:1]):
                return Decoded(None, 0.0, skipped="mid-word (a word character follows the cursor)")
            decoded = self.host.generate(lambda tokens: self.context.build(request, tokens), settings,
                                         end.stop_at_newline, should_stop, cache_key=uri,
                                         stop_when=end.cut if end.multiline else None)
            if decoded is not None and decoded.result is not None:  # counted even when superseded
                loop.call_soon_threadsafe(self.stats.record_generation, decoded.result)
            return decoded
        return job

    @staticmethod
    def _completion(text: str | None, cursor: Cursor, uri: str) -> Completion | None:
        if text is None:
            return None
        return Completion(text, types.Range(cursor.start_position(), cursor.line_end_position()), uri)

    def _finish(self, outcome: Outcome, cursor: Cursor, situation: Situation,
                uri: str) -> tuple[Completion | None, str, bool]:
        """The completion, a note for the log, and whether it is final (worth remembering)."""
        decoded: Decoded | None = outcome.value
        if outcome.budget_exhausted:
            self.stats.budget_exhausted += 1
        if outcome.status == "superseded":
            self.stats.superseded += 1
            return None, "superseded", False
        if outcome.status == "failed":
            self.stats.failed += 1
            return None, f"decode failed: {outcome.error}", False
        if outcome.status == "done" and decoded is not None and decoded.skipped:
            return None, decoded.skipped, True
        if outcome.status != "done" or decoded is None:
            return None, outcome.status if decoded is not None else "model unloaded", False
        result = decoded.result
        post_started = time.perf_counter()
        text = postprocess.finish(result.text, situation)
        post_ms = (time.perf_counter() - post_started) * 1000
        s = result.stats
        self.stats.record_phases(queue_ms=outcome.queued_ms, prompt_ms=decoded.prompt_ms, stats=s,
                                 post_ms=post_ms)
        if s.target_passes == 0 and s.known_tokens > 0:
            self.stats.reuse["from_chain"] += 1
        budget = " (budget)" if outcome.budget_exhausted else ""
        note = (f"{result.stop_reason}{budget}, {s.new_tokens} tokens, "
                f"{s.target_passes} passes, {s.tokens_per_pass:.2f}/pass, prompt {s.prompt_tokens} "
                f"({s.reused_tokens} reused, {s.known_tokens} known), "
                f"healed {decoded.prompt.healed if decoded.prompt else ''!r}, "
                f"queued {outcome.queued_ms:.0f} ms")
        final = not outcome.budget_exhausted and result.stop_reason != "cancelled"
        if text is None:
            return None, f"nothing to suggest ({note})", final
        return self._completion(text, cursor, uri), note, final

    # -- idle-time work ------------------------------------------------------------------------------
    def _after_answer(self, uri: str, settings: Settings) -> None:
        """Work ahead for the latest answer only: earlier plans are stale."""
        if self._background is not None:
            self._background.cancel()
        self._background = asyncio.ensure_future(self._work_ahead(uri, settings, self._requests_seen))

    async def _work_ahead(self, uri: str, settings: Settings, seen: int) -> None:
        await asyncio.sleep(IDLE_BEFORE_BACKGROUND_S)
        if self._requests_seen != seen or not self.host.ready:
            return  # the user typed on: the next answer will bring us back here
        documents = {u: DocumentSnapshot(d.version, d.source) for u, d in self._documents().items()}
        outcome = await self.scheduler.run_background(
            lambda stop: self.host.background(settings, documents, uri, stop))
        if outcome.value is not None:  # kept apart from the request decodes' counters
            self.stats.record_prefetch(outcome.value)
        elif outcome.status == "superseded":
            self.stats.prefetch["preempted"] += 1

    def accepted(self, uri: str, text: str) -> None:
        """The client ran the accepted-item command."""
        self.stats.reuse["accepted"] += 1
        self.host.sources.accepted(text)

    def _answered(self, kind: str, uri: str, position: types.Position, started: float, note: str,
                  *, empty: bool) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        self.stats.answer(latency_ms, empty=empty)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %d:%d -> %s in %.0f ms: %s", kind, uri, position.line, position.character,
                      "empty" if empty else "answer", latency_ms, note)
