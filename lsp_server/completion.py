"""From a request (document, position, trigger) to an insert text and a range, with the bookkeeping.

The handlers in ``server.py`` stay thin: they look up the document and translate to and from LSP
types; this module decides whether to decode at all (enabled, model ready), builds the prompt,
schedules the decode (debounce, supersede, budget), post-processes it and counts the outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

from lsp_server.config import Settings
from lsp_server.context import ContextRequest, Prompt, build_prompt
from lsp_server.documents import Cursor, PositionError, locate
from lsp_server.model_host import ModelHost
from lsp_server.postprocess import line_item_text
from lsp_server.scheduler import Outcome, Scheduler
from lsp_server.stats import ServerStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    text: str  # replaces ``range``: the cursor to the end of its line
    range: types.Range


class CompletionService:
    def __init__(self, host: ModelHost, scheduler: Scheduler, stats: ServerStats,
                 settings: Callable[[], Settings]) -> None:
        self.host, self.scheduler, self.stats, self._settings = host, scheduler, stats, settings

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
        prompt = build_prompt(ContextRequest(text=document.source, offset=cursor.offset,
                                             budget_tokens=settings.context_tokens, uri=uri,
                                             language_id=document.language_id))
        multiline = settings.multiline and not cursor.after.strip()
        outcome = await self.scheduler.run(
            f"{kind}:{uri}", self._job(prompt, settings, multiline),
            debounce_s=0.0 if invoked else settings.debounce_ms / 1000,
            budget_s=settings.time_budget_ms / 1000 or None)
        return self._finish(outcome, cursor, prompt, multiline)

    def _job(self, prompt: Prompt, settings: Settings,
             multiline: bool) -> Callable[[Callable[[], bool]], Any]:
        loop = asyncio.get_running_loop()

        def job(should_stop: Callable[[], bool]) -> Any:
            result = self.host.generate(prompt, settings, not multiline, should_stop)
            if result is not None:  # counted even when nobody waits for it any more (superseded)
                loop.call_soon_threadsafe(self.stats.record_generation, result)
            return result
        return job

    def _finish(self, outcome: Outcome, cursor: Cursor, prompt: Prompt,
                multiline: bool) -> tuple[Completion | None, str]:
        result = outcome.value
        if outcome.budget_exhausted:
            self.stats.budget_exhausted += 1
        if outcome.status == "superseded":
            self.stats.superseded += 1
            return None, "superseded"
        if outcome.status == "failed":
            self.stats.failed += 1
            return None, f"decode failed: {outcome.error}"
        if outcome.status != "done" or result is None:
            return None, outcome.status if result is not None else "model unloaded"
        text = line_item_text(result.text, cursor.after, prompt.healed, multiline)
        s = result.stats
        budget = " (budget)" if outcome.budget_exhausted else ""
        note = (f"{result.stop_reason}{budget}, {s.new_tokens} tokens, "
                f"{s.target_passes} passes, {s.tokens_per_pass:.2f}/pass, prompt {s.prompt_tokens}, "
                f"queued {outcome.queued_ms:.0f} ms")
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
