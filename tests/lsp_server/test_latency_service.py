"""Latency that does not scale with the CPU's slowness (issue 40, item 6), in the request pipeline:
the server's own ``CompletionService``, scheduler and model host, in-process.

A slow CPU is simulated by wrapping the engine's forward so that every pass sleeps in proportion
to what it feeds (the engine sizes its prefill passes from measured time, so it adapts to that as
it would to a slow machine). The checks are on behaviour: what is answered, from where, and what
the editors are told; never on how long anything took.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types

from speculative_complete.lsp_server.completion import CompletionService
from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.documents import LspTextDocument
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.scheduler import Scheduler
from speculative_complete.lsp_server.stats import ServerStats
from tests.support.lsp import tiny_model_dir

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_S = 60.0  # a hang guard only


class Service:
    """A ``CompletionService`` over one document whose text and settings a test may change."""

    def __init__(self, settings: Settings, uri: str, text: str) -> None:
        self.settings = settings
        self.host = ModelHost()
        self.scheduler = Scheduler()
        self.stats = ServerStats()
        self.service = CompletionService(self.host, self.scheduler, self.stats, lambda: self.settings)
        self.uri, self.text = uri, text

    async def ask(self, offset: int | None = None, uri: str | None = None) -> str | None:
        offset = len(self.text) if offset is None else offset
        before = self.text[:offset]
        position = types.Position(before.count("\n"), len(before) - (before.rfind("\n") + 1))
        document = LspTextDocument(uri or self.uri, self.text, language_id="python")
        item = await self.service.complete("inline", uri or self.uri, document, position, invoked=False)
        return item.text if item is not None else None

    def slow_down(self, ms_per_token: float) -> None:
        """Every target pass sleeps ``ms_per_token`` per token it feeds: a slow CPU."""
        engine = self.host.local.engine
        forward = engine._forward

        def slow_forward(tokens, cache, *rest, **options):
            time.sleep(ms_per_token * len(tokens) / 1000)
            return forward(tokens, cache, *rest, **options)

        engine._forward = slow_forward


async def started(settings: Settings, uri: str, text: str) -> Service:
    running = Service(settings, uri, text)
    state = await running.host.load(settings)
    assert state is not None and state.status == "ready", state
    return running


# -- a budget shorter than a cold prefill ------------------------------------------------------

LONG_FILE = (
    "".join(
        f"def handler_{i}(request, retries={i}):\n    response = send(request, timeout={i})\n"
        f"    if response.status != {200 + i}:\n        raise Failure(response)\n    return response\n\n\n"
        for i in range(40)
    )
    + "def main(argv):\n    config = load(argv)\n    result = "
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny() -> AsyncIterator[Service]:
    settings = Settings(
        model=str(tiny_model_dir()),
        device="cpu",
        dtype="float32",
        draft_head="none",
        drafter="ngram",
        context_tokens=400,
        max_new_tokens=6,
        time_budget_ms=300,
        prefetch=False,
        workspace_index_mb=0,
    )
    running = await started(settings, "file:///work/handlers.py", LONG_FILE)
    running.slow_down(4.0)  # a 400-token prefill takes over a second: more than the budget
    yield running
    running.scheduler.close()


async def test_a_cold_prefill_longer_than_the_budget_is_finished_and_answered(tiny):
    """The user typed and paused on a cold prompt whose prefill outlasts ``timeBudgetMs``: the
    request waits for it and its line (as llama.vim waits for llama-server's first line), and the
    answer is what a decode with no budget at all and no reuse writes; nothing counts as cut."""
    budget_exhausted = tiny.stats.budget_exhausted
    answered = await tiny.ask()
    assert answered is not None
    assert tiny.stats.budget_exhausted == budget_exhausted
    assert tiny.stats.stop_reasons.get("cancelled", 0) == 0
    tiny.settings = replace(tiny.settings, time_budget_ms=0, kv_cache_mb=0)
    try:
        assert answered == await tiny.ask(uri="file:///work/fresh.py")  # no budget, no reuse
    finally:
        tiny.settings = replace(tiny.settings, time_budget_ms=300, kv_cache_mb=256)


async def test_a_newer_keystroke_stops_the_cold_prefill_and_goes_on_from_it(tiny):
    """A keystroke during the cold prefill supersedes its request at the next pass (answered
    empty at once), and the newer request prefills only what the first did not."""
    tiny.text = LONG_FILE.replace("handler_", "route_")  # a cold prompt again
    first = asyncio.ensure_future(tiny.ask())
    await asyncio.sleep(0.5)  # part of the way through the prefill
    tiny.text += "x"  # the user typed on
    decodes: list[Any] = []
    record = tiny.stats.record_generation
    tiny.stats.record_generation = lambda result: (decodes.append(result), record(result))
    try:
        second = await asyncio.wait_for(tiny.ask(), WAIT_S)
    finally:
        tiny.stats.record_generation = record
    assert await asyncio.wait_for(first, WAIT_S) is None
    assert second is not None
    mine = decodes[-1].stats
    assert 0 < mine.reused_tokens < mine.prompt_tokens - 8  # went on from the part prefilled


async def test_a_single_line_is_never_cut_by_the_budget(tiny):
    """Every pass of the line's decode is slow (the prompt is warm): the line takes longer than
    the budget, and is answered whole, as with no budget."""
    tiny.text = LONG_FILE.replace("handler_", "view_")
    await tiny.ask()  # the prompt is in the cache now
    engine = tiny.host.local.engine
    forward = engine._forward

    def slow_steps(tokens, cache, *rest, **options):
        time.sleep(0.12)  # six tokens a line: longer than the 300 ms budget
        return forward(tokens, cache, *rest, **options)

    engine._forward = slow_steps
    try:
        tiny.text += "0\n    other = "  # a new line: a few tokens to prefill, then the line
        passes = tiny.stats.target_passes
        whole = await tiny.ask()
        assert tiny.stats.target_passes - passes >= 3  # the premise: 0.36 s of passes or more
        tiny.settings = replace(tiny.settings, time_budget_ms=0)
        assert whole == await tiny.ask(uri="file:///work/unbudgeted.py")
    finally:
        engine._forward = forward
        tiny.settings = replace(tiny.settings, time_budget_ms=300)


# -- a multi-line body answered with the lines ready at the first-answer budget -------------------

STACK = (
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        "
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real() -> AsyncIterator[Service]:
    settings = Settings(time_budget_ms=120000, first_answer_ms=0, prefetch=False, workspace_index_mb=0)
    running = await started(settings, "file:///work/stack.py", STACK)
    yield running
    running.scheduler.close()


async def eventually(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


@pytest.mark.real_model
async def test_a_block_is_answered_with_its_whole_lines_and_the_rest_comes_from_the_chain(real):
    """On a slow CPU (every pass takes 150 ms) a block body is answered with the whole lines
    ready at the first-answer budget, never a partial line; the rest is decoded ahead at once,
    and after the user accepts and starts the next line, that line comes from the document's
    greedy chain with no target pass, as the whole block decoded in one go has it."""
    whole = await real.ask(uri="file:///work/whole.py")  # no first-answer budget, fast
    assert whole is not None and whole.count("\n") >= 2, whole  # the premise: three lines or more
    real.settings = replace(real.settings, first_answer_ms=250)
    engine = real.host.local.engine
    forward = engine._forward

    def slow_forward(tokens, cache, *rest, **options):
        time.sleep(0.15)
        return forward(tokens, cache, *rest, **options)

    engine._forward = slow_forward
    shown = await real.ask()
    assert shown is not None and shown.count("\n") < whole.count("\n")
    assert whole.startswith(shown + "\n"), (shown, whole)  # whole lines only
    assert real.stats.stop_reasons.get("partial") == 1
    await eventually(lambda: real.stats.prefetch["rests"] == 1, "the rest decoded ahead")
    following = whole[len(shown) + 1 :].split("\n")[0]
    indentation = following[: len(following) - len(following.lstrip())]
    real.text += shown + "\n" + indentation  # accepted, Enter, and the editor indents
    from_chain = real.stats.reuse["from_chain"]
    assert await real.ask() == following.strip()
    assert real.stats.reuse["from_chain"] == from_chain + 1


# -- rows chosen again at a pause, not at a keystroke ---------------------------------------------

TYPED_LINES = [f"    total_{i} = combine(config, total_{i - 1}, weight={i})\n" for i in range(1, 25)]


async def typed_down(settings: Settings) -> tuple[list[Any], int]:
    """Lines typed one by one at the end of ``LONG_FILE``'s ``main``, a pause after each: the
    keystrokes' decodes (idle work's are counted apart), and how many times idle work renewed
    the rows."""
    running = await started(settings, "file:///work/typed.py", LONG_FILE + "0\n")
    decodes: list[Any] = []
    record = running.stats.record_generation
    running.stats.record_generation = lambda result: (decodes.append(result), record(result))
    try:
        for line in TYPED_LINES:
            running.text += line[:-1]
            await running.ask()
            await asyncio.sleep(0.5)  # the pause at the line's end: idle work runs
            running.text += "\n"
        return decodes, running.stats.prefetch["renewed"]
    finally:
        running.scheduler.close()


async def test_rows_nearly_outgrown_are_chosen_again_at_the_pause_before(tiny):
    """Typing line after line fills the room the prompt's kept rows leave; the keystroke that
    outgrows it has them chosen again and prefills the prompt from near its start. With prefetch
    on (shipped), the pause at a line's end does that where little room is left, and every
    keystroke's prompt is found in the cache but for its own line; with prefetch off, some
    keystroke prefills most of its prompt (the case the idle work is for)."""
    settings = replace(tiny.settings, context_tokens=256, time_budget_ms=60000, max_new_tokens=3)
    for prefetch in (True, False):
        decodes, renewed = await typed_down(replace(settings, prefetch=prefetch))
        fresh = [r.stats.prompt_tokens - r.stats.reused_tokens for r in decodes[1:]]  # not the cold one
        assert len(fresh) == len(TYPED_LINES) - 1
        if prefetch:
            assert renewed >= 2 and max(fresh) <= 40, (renewed, fresh)
        else:
            assert renewed == 0 and max(fresh) > 100, fresh
