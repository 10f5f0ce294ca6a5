"""The completion pipeline in-process: the server's own ``CompletionService``, scheduler and model
host, over a tiny random model with the real tokenizer (loaded by the server's own loader).

What a server process would hide: the reason an unanswered request is logged with, and whether an
identical-looking request is answered from memory when its prompt would differ.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio
from lsprotocol import types
from transformers import AutoTokenizer

from speculative_complete.lsp_server.completion import CompletionService
from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.context.tokens import Tokens
from speculative_complete.lsp_server.documents import LspTextDocument
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.scheduler import Scheduler
from speculative_complete.lsp_server.stats import ServerStats
from tests.support.lsp import tiny_model_dir, tokenizer_source

pytestmark = pytest.mark.asyncio(loop_scope="module")

URI = "file:///work/main_module.py"
BUDGET = 160  # tokens: too few for every unit, so the rows shown are chosen
UNITS = "".join(
    f"def helper_{i}(value, scale={i}):\n    total = value * scale + {i}\n    return total - {i}\n\n\n"
    for i in range(8)
)
MAIN = (
    "def main(argv):\n    first = helper_0(argv)\n    second = helper_1(first)\n"
    "    third = helper_2(second)\n    fourth = helper_3(third)\n    fifth = helper_4(fourth)\n"
)
TEXT = "import os\nimport sys\n\n\n" + UNITS + MAIN
UPPER = TEXT.index("    first = helper_0(argv)") + len("    first = helper_0(argv)")
LOWER = TEXT.index("    fourth = helper_3(third)") + len("    fourth = helper_3(third)")


class Service:
    """A ``CompletionService`` whose settings a test may change between requests."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.host = ModelHost()
        self.scheduler = Scheduler()
        self.stats = ServerStats()
        self.service = CompletionService(self.host, self.scheduler, self.stats, lambda: self.settings)
        self.document = LspTextDocument(URI, TEXT, language_id="python")

    async def ask(self, offset: int) -> str | None:
        before = TEXT[:offset]
        position = types.Position(before.count("\n"), len(before) - (before.rfind("\n") + 1))
        item = await self.service.complete("inline", URI, self.document, position, invoked=True)
        return item.text if item is not None else None


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[Service]:
    settings = Settings(
        model=str(tiny_model_dir()),
        device="cpu",
        dtype="float32",
        draft_head="none",
        drafter="ngram",
        context_tokens=BUDGET,
        max_new_tokens=6,
        time_budget_ms=60000,
        prefetch=False,
        workspace_index_mb=0,
    )
    running = Service(settings)
    state = await running.host.load(settings)
    assert state is not None and state.status == "ready", state
    yield running
    running.scheduler.close()


def prompts_along(offsets: list[int]) -> list[tuple[int, ...]]:
    """The prompt ids one builder gives for requests at ``offsets`` of TEXT, in turn."""
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    builder = ContextBuilder()
    requests = (ContextRequest(TEXT, offset, BUDGET, uri=URI, language_id="python") for offset in offsets)
    return [builder.build(request, tokens).ids for request in requests]


def test_a_prompt_is_built_again_from_the_state_it_left_and_otherwise_after_another():
    """What the answer memory's key relies on (``ContextBuilder.state``): asked again at once,
    LOWER's prompt is the same; asked again after UPPER, whose rows are kept, it is not (which is
    what makes the next test mean something)."""
    first, repeated, _, after_upper, repeated_after = prompts_along([LOWER, LOWER, UPPER, LOWER, LOWER])
    assert repeated == first
    assert after_upper != first
    assert repeated_after == after_upper


async def test_the_same_text_and_cursor_with_another_prompt_is_decoded_again(service):
    repeated = service.stats.reuse["repeated"]
    first = await service.ask(LOWER)
    assert await service.ask(LOWER) == first  # asked again as it was: from memory
    assert service.stats.reuse["repeated"] == repeated + 1
    await service.ask(UPPER)
    decodes = service.stats.decodes
    await service.ask(LOWER)  # the same text and cursor as the first, but other rows shown
    assert service.stats.reuse["repeated"] == repeated + 1, "answered from the other prompt's memory"
    assert service.stats.decodes == decodes + 1
    await service.ask(LOWER)  # and this prompt's answer is remembered in its turn
    assert service.stats.reuse["repeated"] == repeated + 2


def notes(records: list[logging.LogRecord]) -> list[str]:
    """The reasons the debug log gives for each answer (after the last ': ')."""
    answers = [r.getMessage() for r in records if r.name == "speculative_complete.lsp_server.completion"]
    return [message.rsplit(": ", 1)[-1] for message in answers if " -> " in message]


async def test_a_request_queued_behind_another_document_waits_for_the_worker(service):
    """On the local engine the budget never gives up on a request before its line: one queued
    behind another document's decode past its budget is answered once the worker is free (a
    remote engine's would expire: ``tests/lsp_server/test_scheduler.py``)."""
    release = threading.Event()
    other = service.scheduler.run("inline:file:///other.py", lambda stop: release.wait(30))
    busy = asyncio.ensure_future(other)  # another document's decode holds the worker
    await asyncio.sleep(0.05)
    service.settings = replace(service.settings, time_budget_ms=100)
    try:
        asked = asyncio.ensure_future(service.ask(LOWER + 1))
        await asyncio.sleep(0.4)  # well past the budget
        assert not asked.done()
        release.set()
        assert await asked is not None
    finally:
        release.set()
        service.settings = replace(service.settings, time_budget_ms=60000)
        await busy


async def test_a_request_cancelled_before_it_runs_is_logged_as_cancelled(service, caplog):
    service.scheduler.close()  # the server is stopping: nothing more runs
    with caplog.at_level(logging.DEBUG, logger="speculative_complete.lsp_server.completion"):
        assert await service.ask(UPPER + 1) is None
    assert notes(caplog.records) == ["cancelled"]
