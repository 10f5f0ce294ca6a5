"""``IdleWork``'s planning rules, on the real local runtime and the tests' tiny model, in-process:
the server's own ``CompletionService``, scheduler and model host.

The runtime is the real ``LocalRuntime`` noting each idle-time call made on it (``draft_indexing``,
``decode_ahead``, ``renew``), which is how these tests see that idle work goes through the runtime
interface, and which document it worked for. Nothing is stood in for: every call decodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields, replace

import pytest
import pytest_asyncio
from lsprotocol import types

from speculative_complete.lsp_server.completion import CompletionService
from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.documents import LspTextDocument
from speculative_complete.lsp_server.idle import IDLE_BEFORE_BACKGROUND_S
from speculative_complete.lsp_server.local.loading import load_runtime
from speculative_complete.lsp_server.local.local_runtime import LocalRuntime
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.scheduler import Scheduler
from speculative_complete.lsp_server.stats import ServerStats
from tests.support.lsp import tiny_model_dir

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_S = 60.0  # a hang guard only
FIRST, SECOND = "file:///work/first.py", "file:///work/second.py"
SOURCE = "def area(width, height):\n    result = width * height\n    return result\n\n\nvalue = "
LINES = [f"    total_{i} = combine(config, total_{i - 1}, weight={i})\n" for i in range(1, 25)]
Call = tuple[str, str | None]  # (the method, the document it was for)


@dataclass
class RecordingRuntime(LocalRuntime):
    """The real local runtime, noting the idle-time calls made on it (worker thread)."""

    calls: list[Call] = field(default_factory=list)
    adopted: int = 0  # renewals whose rows the document took

    @classmethod
    def of(cls, runtime: LocalRuntime) -> RecordingRuntime:
        return cls(**{f.name: getattr(runtime, f.name) for f in fields(LocalRuntime)})

    def draft_indexing(self, settings):
        self.calls.append(("draft_indexing", None))
        return super().draft_indexing(settings)

    def decode_ahead(self, uri, settings, should_stop, rest=None):
        self.calls.append(("decode_ahead", uri))
        return super().decode_ahead(uri, settings, should_stop, rest)

    def renew(self, builder, request, ending, settings, should_stop):
        self.calls.append(("renew", request.uri))
        renewal = super().renew(builder, request, ending, settings, should_stop)
        self.adopted += int(renewal is not None and renewal.adopted)
        return renewal

    def worked_on(self, uri: str) -> list[str]:
        return [method for method, on in self.calls if on == uri]


class Service:
    """A ``CompletionService`` over open documents whose texts and settings a test may change."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.texts: dict[str, str] = {}
        self.host = ModelHost(loader=lambda settings, notice: RecordingRuntime.of(load_runtime(settings)))
        self.scheduler = Scheduler()
        self.stats = ServerStats()
        self.service = CompletionService(
            self.host, self.scheduler, self.stats, lambda: self.settings, self.documents
        )
        self.idle = self.service.idle

    @property
    def runtime(self) -> RecordingRuntime:
        runtime = self.host.runtime
        assert isinstance(runtime, RecordingRuntime)
        return runtime

    def documents(self) -> dict[str, LspTextDocument]:
        return {uri: LspTextDocument(uri, text, language_id="python") for uri, text in self.texts.items()}

    async def ask(self, uri: str) -> str | None:
        """A request at the end of ``uri``'s text, invoked (no debounce)."""
        text = self.texts[uri]
        position = types.Position(text.count("\n"), len(text) - (text.rfind("\n") + 1))
        document = self.documents()[uri]
        item = await self.service.complete("inline", uri, document, position, invoked=True)
        return item.text if item is not None else None


async def eventually(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def worker_caught_up(service: Service) -> None:
    """Every idle job planned so far has run or been dropped: the plans' pause is over and the
    worker has done what was queued before a job of the test's own."""
    await asyncio.sleep(2 * IDLE_BEFORE_BACKGROUND_S)
    outcome = await asyncio.wait_for(service.scheduler.run_background(lambda stop: None), WAIT_S)
    assert outcome.status == "done"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny() -> AsyncIterator[Service]:
    settings = Settings(
        model=str(tiny_model_dir()),
        device="cpu",
        dtype="float32",
        draft_head="none",
        drafter="ngram",
        max_new_tokens=6,
        time_budget_ms=0,
        workspace_index_mb=0,
    )
    service = Service(settings)
    state = await service.host.load(settings)
    assert state is not None and state.status == "ready", state
    service.texts = {FIRST: SOURCE, SECOND: SOURCE.replace("area", "volume")}
    await service.ask(FIRST)
    await service.ask(SECOND)  # both documents have a greedy chain to decode ahead on
    await worker_caught_up(service)
    yield service
    service.scheduler.close()


async def test_after_an_answer_the_next_line_is_decoded_ahead_through_the_runtime(tiny):
    """An answer plans, after a short pause, the draft sources and the line after the suggestion,
    both asked of the runtime; what it decoded is counted as a prefetch, apart from requests."""
    tiny.texts[FIRST] = SOURCE + "1\nother = "  # a new line: the chain has nothing past it yet
    tiny.runtime.calls.clear()
    runs, requests = tiny.stats.prefetch["runs"], tiny.stats.requests
    await tiny.ask(FIRST)
    await eventually(lambda: tiny.stats.prefetch["runs"] == runs + 1, "a decode ahead counted")
    assert tiny.runtime.calls == [("draft_indexing", None), ("decode_ahead", FIRST)]
    assert tiny.stats.requests == requests + 1  # the decode ahead is no request
    assert not tiny.idle.prefetching


async def test_a_new_plan_cancels_the_one_before(tiny):
    """Two answers in a row: only the latter's work is done (the user moved on from the first)."""
    await worker_caught_up(tiny)
    tiny.runtime.calls.clear()
    tiny.idle.after_answer(FIRST, tiny.settings)
    tiny.idle.after_answer(SECOND, tiny.settings)
    await eventually(lambda: tiny.runtime.worked_on(SECOND), "the second answer's work")
    await worker_caught_up(tiny)
    assert tiny.runtime.worked_on(SECOND) == ["decode_ahead"]
    assert tiny.runtime.worked_on(FIRST) == []


async def test_work_planned_before_a_request_came_is_dropped(tiny):
    """A request after the answer (the user typed on): the work planned for the answer never
    starts, as the next answer will plan its own."""
    await worker_caught_up(tiny)
    tiny.runtime.calls.clear()
    tiny.idle.after_answer(FIRST, tiny.settings)
    tiny.idle.request_came()
    await worker_caught_up(tiny)
    assert tiny.runtime.calls == []
    tiny.idle.after_answer(FIRST, tiny.settings)  # the premise: without the request, it would run
    await eventually(lambda: tiny.runtime.worked_on(FIRST), "the work planned")


async def test_a_runtime_that_does_not_work_ahead_is_not_asked_to(tiny):
    """The transformers peer decoder keeps no chains and no draft sources (``works_ahead``):
    answers plan no work on it."""
    await worker_caught_up(tiny)
    tiny.runtime.calls.clear()
    tiny.settings = replace(tiny.settings, decoder="transformers")
    try:
        tiny.idle.after_answer(FIRST, tiny.settings)
        await worker_caught_up(tiny)
        assert tiny.runtime.calls == []
    finally:
        tiny.settings = replace(tiny.settings, decoder="speculative")


async def test_rows_nearly_outgrown_are_renewed_through_the_runtime_at_a_pause(tiny):
    """Lines typed one by one, a pause after each: where the prompt's rows have little room left,
    the pause's work is a renewal asked of the runtime instead of a decode ahead, and the
    document takes the renewed rows; the stats count exactly the renewals the runtime adopted."""
    uri = "file:///work/typed.py"
    tiny.settings = replace(tiny.settings, context_tokens=256, max_new_tokens=3)
    tiny.texts[uri] = SOURCE + "0\n"
    renewed = tiny.stats.prefetch["renewed"]
    try:
        for line in LINES:
            tiny.texts[uri] += line[:-1]
            before = len(tiny.runtime.worked_on(uri))
            await tiny.ask(uri)
            await eventually(lambda: len(tiny.runtime.worked_on(uri)) > before, "the pause's work")  # noqa: B023
            await worker_caught_up(tiny)
            tiny.texts[uri] += "\n"
            if tiny.runtime.adopted:
                break
    finally:
        tiny.settings = replace(tiny.settings, context_tokens=512, max_new_tokens=6)
        tiny.texts.pop(uri)
    assert "renew" in tiny.runtime.worked_on(uri), tiny.runtime.worked_on(uri)
    assert tiny.runtime.adopted == 1
    assert tiny.stats.prefetch["renewed"] == renewed + 1
