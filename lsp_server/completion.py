"""From a request (document, position, trigger) to an insert text and a range, with the bookkeeping.

The handlers in ``server.py`` stay thin: they look up the document and translate to and from LSP
types; this module decides whether to decode at all (enabled, model ready), builds the prompt,
schedules the decode (debounce, supersede, budget), post-processes it and counts the outcome.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

from lsp_server import languages, postprocess
from lsp_server.config import Settings
from lsp_server.context import ContextBuilder, ContextRequest, Prompt
from lsp_server.documents import Cursor, PositionError, locate
from lsp_server.model_host import ModelHost
from lsp_server.postprocess import Situation
from lsp_server.scheduler import Outcome, Scheduler
from lsp_server.snippets import OpenDocument
from lsp_server.stats import ServerStats

log = logging.getLogger(__name__)


_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True)
class Completion:
    text: str  # replaces ``range``: the cursor to the end of its line
    range: types.Range


@dataclass(frozen=True)
class Decoded:
    """What the worker hands back: the prompt it built and the engine's result, or why it did
    not decode."""

    prompt: Prompt | None
    result: Any  # decoding.GenerationResult
    skipped: str = ""


class CompletionService:
    def __init__(self, host: ModelHost, scheduler: Scheduler, stats: ServerStats,
                 settings: Callable[[], Settings],
                 documents: Callable[[], Iterable[TextDocument]] = tuple) -> None:
        self.host, self.scheduler, self.stats, self._settings = host, scheduler, stats, settings
        self._documents = documents  # every open document, for snippets from the others
        self.context = ContextBuilder()  # used on the worker thread only

    async def complete(self, kind: str, uri: str, document: TextDocument | None, position: types.Position,
                       *, invoked: bool) -> Completion | None:
        """Answer one request; every path counts exactly one answer (or re-raises after counting)."""
        started = time.monotonic()
        self.stats.requests += 1
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
        request, situation = self._snapshot(uri, document, cursor, settings)
        outcome = await self.scheduler.run(
            f"{kind}:{uri}", self._job(request, situation, settings),
            debounce_s=0.0 if invoked else settings.debounce_ms / 1000,
            budget_s=settings.time_budget_ms / 1000 or None)
        return self._finish(outcome, cursor, situation)

    def _snapshot(self, uri: str, document: TextDocument, cursor: Cursor,
                  settings: Settings) -> tuple[ContextRequest, Situation]:
        """What the worker needs, taken now (documents keep changing on the event loop). Cheap:
        strings are shared, not copied, and only the lines around the cursor are looked at."""
        text = document.source
        spec = languages.detect(document.language_id, uri)
        others = tuple(OpenDocument(d.uri, d.source, d.language_id) for d in self._documents()
                       if d.uri != document.uri) if settings.neighbor_snippets else ()
        request = ContextRequest(text=text, offset=cursor.offset, budget_tokens=settings.context_tokens,
                                 uri=uri, language_id=document.language_id, others=others,
                                 fim_template=settings.fim_template,
                                 neighbor_snippets=settings.neighbor_snippets, heal=settings.token_healing)
        situation = postprocess.situation_for(text, cursor.offset, cursor.before, cursor.after, spec,
                                              settings.multiline, settings.max_lines)
        return request, situation

    def _job(self, request: ContextRequest, situation: Situation,
             settings: Settings) -> Callable[[Callable[[], bool]], Any]:
        loop = asyncio.get_running_loop()
        end = situation.ending

        def job(should_stop: Callable[[], bool]) -> Any:
            # Checked here, not before scheduling, so the request still supersedes the decode
            # running for an older keystroke, like any other.
            if _WORD_CHAR.match(situation.after[:1]):
                return Decoded(None, None, "mid-word (a word character follows the cursor)")
            tokens = self.host.tokens()
            if tokens is None:
                return None
            prompt = self.context.build(request, tokens)  # here: it counts tokens
            result = self.host.generate(prompt, settings, end.stop_at_newline, should_stop,
                                        stop_when=end.cut if end.multiline else None, tokens=tokens)
            if result is None:
                return None
            loop.call_soon_threadsafe(self.stats.record_generation, result)  # even when superseded
            return Decoded(prompt, result)
        return job

    def _finish(self, outcome: Outcome, cursor: Cursor,
                situation: Situation) -> tuple[Completion | None, str]:
        decoded = outcome.value
        result = decoded.result if decoded is not None else None
        if outcome.budget_exhausted:
            self.stats.budget_exhausted += 1
        if outcome.status == "superseded":
            self.stats.superseded += 1
            return None, "superseded"
        if outcome.status == "failed":
            self.stats.failed += 1
            return None, f"decode failed: {outcome.error}"
        if outcome.status == "done" and decoded is not None and decoded.skipped:
            return None, decoded.skipped
        if outcome.status != "done" or result is None:
            return None, outcome.status if result is not None else "model unloaded"
        text = postprocess.finish(result.text, situation)
        s = result.stats
        budget = " (budget)" if outcome.budget_exhausted else ""
        note = (f"{result.stop_reason}{budget}, {s.new_tokens} tokens, "
                f"{s.target_passes} passes, {s.tokens_per_pass:.2f}/pass, prompt {s.prompt_tokens}, "
                f"healed {decoded.prompt.healed!r}, queued {outcome.queued_ms:.0f} ms")
        if text is None:
            return None, f"nothing to suggest ({note})"
        return Completion(text, types.Range(cursor.start_position(), cursor.line_end_position())), note

    def _answered(self, kind: str, uri: str, position: types.Position, started: float, note: str,
                  *, empty: bool) -> None:
        latency_ms = (time.monotonic() - started) * 1000
        self.stats.answer(latency_ms, empty=empty)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %d:%d -> %s in %.0f ms: %s", kind, uri, position.line, position.character,
                      "empty" if empty else "answer", latency_ms, note)

