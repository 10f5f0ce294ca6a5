"""Cancellation, supersede, debounce and the time budget, end to end through the server process.

Stats are cumulative over the module's shared server, so each test compares before and after.
A multi-line decode of 2000 tokens with no first-answer budget takes the tiny model seconds:
long enough to be interrupted for certain."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

LONG = {"maxNewTokens": 2000, "multiline": True, "timeBudgetMs": 0, "firstAnswerMs": 0, "debounceMs": 0}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    client, _ = await h.start_initialized()
    yield client
    await h.stop(client)


def delta(before: dict, after: dict, key: str) -> int:
    return after[key] - before[key]


def reasons(before: dict, after: dict) -> dict[str, int]:
    keys = set(before["stop_reasons"]) | set(after["stop_reasons"])
    changes = {k: after["stop_reasons"].get(k, 0) - before["stop_reasons"].get(k, 0) for k in keys}
    return {k: v for k, v in changes.items() if v}


async def settled(client, before: dict, decodes: int) -> dict:
    """Stats once ``decodes`` more decodes have reported back (they report after the answer)."""
    deadline = time.monotonic() + h.ANSWER_TIMEOUT_S
    while True:
        current = await h.stats(client)
        if delta(before, current, "decodes") >= decodes:
            return current
        assert time.monotonic() < deadline, f"decodes never reported: {current}"
        await asyncio.sleep(0.05)


async def test_cancel_request_stops_the_decode_mid_way_and_is_answered(client):
    await h.configure(client, LONG)
    uri = "file:///work/cancel.py"
    h.open_document(client, "def total(items):\n    return sum", uri=uri)
    before = await h.stats(client)
    msg_id = "cancel-me"
    future = client.protocol.send_request(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, h.inline_params(1, 14, uri), msg_id=msg_id
    )
    await asyncio.sleep(0.5)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(asyncio.wrap_future(future), h.ANSWER_TIMEOUT_S)
    after = await settled(client, before, decodes=1)
    assert delta(before, after, "cancelled") == 1 and delta(before, after, "answered") == 1
    assert reasons(before, after)["cancelled"] == 1  # the engine itself stopped, mid-decode


async def test_fifty_rapid_requests_with_edits_are_all_answered_and_only_the_newest_decodes(client):
    await h.configure(client, {"maxNewTokens": 16, "debounceMs": 1000, "timeBudgetMs": 60000})
    uri = "file:///work/typing.py"
    line = "result = compute"
    h.open_document(client, line, uri=uri)
    before = await h.stats(client)
    pending = []
    for i in range(50):  # the user types on; like Neovim, the client never cancels
        h.edit(client, uri, i + 2, (0, len(line)), (0, len(line)), "x")
        line += "x"
        pending.append(
            client.text_document_inline_completion_async(h.inline_params(0, len(line), uri, invoked=False))
        )
    answers = await asyncio.wait_for(asyncio.gather(*pending), h.ANSWER_TIMEOUT_S)
    assert all(answer.items == () for answer in answers[:-1])
    after = await settled(client, before, decodes=1)
    assert delta(before, after, "requests") == delta(before, after, "answered") == 50
    # Each stale request was superseded by the next, or, if the next keystrokes had already
    # reached the server when it was looked at, answered at once: its cursor is mid-word now.
    assert delta(before, after, "superseded") + delta(before, after, "mid_word") == 49
    assert delta(before, after, "decodes") == 1 and reasons(before, after).get("cancelled", 0) == 0
    if answers[-1].items:
        assert answers[-1].items[0].range.start == types.Position(0, len(line))


async def test_a_newer_invoked_request_stops_the_running_decode(client):
    await h.configure(client, {**LONG, "maxNewTokens": 400})
    uri = "file:///work/supersede.py"
    h.open_document(client, "value = 1", uri=uri)
    before = await h.stats(client)
    pending = []
    for i in range(20):
        # Symbols, not word characters: a request that is handled after the next edit arrived
        # must still decode (and be superseded), not stop early as a mid-word position.
        h.edit(client, uri, i + 2, (0, 8 + i), (0, 9 + i), "+-*/"[i % 4] + "%")
        pending.append(client.text_document_inline_completion_async(h.inline_params(0, 10 + i, uri)))
        await asyncio.sleep(0.02)
    answers = await asyncio.wait_for(asyncio.gather(*pending), h.ANSWER_TIMEOUT_S)
    assert all(answer.items == () for answer in answers[:-1])
    after = await h.stats(client)
    assert delta(before, after, "superseded") == 19 and delta(before, after, "answered") == 20
    after = await settled(client, before, decodes=delta(before, after, "decodes"))
    started = delta(before, after, "decodes")
    assert started >= 1 and reasons(before, after).get("cancelled", 0) == started - 1


async def test_the_time_budget_answers_a_block_with_its_whole_lines_so_far(client):
    """A 2000-token block cannot be written in 300 ms: it is answered with the whole lines decoded
    by then (stop reason ``partial``), never stopped mid-line or cancelled."""
    await h.configure(client, {**LONG, "timeBudgetMs": 300})
    uri = "file:///work/budget.py"
    h.open_document(client, "names = [", uri=uri)
    before = await h.stats(client)
    answer = await h.inline(client, 0, 9, uri=uri)
    (item,) = answer.items
    assert item.insert_text.strip() and item.range.start == types.Position(0, 9)
    after = await settled(client, before, decodes=1)
    assert delta(before, after, "budget_exhausted") == 0 and reasons(before, after) == {"partial": 1}


async def test_the_debounce_holds_automatic_requests_but_not_invoked_ones(client):
    await h.configure(client, {"maxNewTokens": 16, "debounceMs": 10000})
    uri = "file:///work/debounce.py"
    h.open_document(client, "count = len", uri=uri)
    before = await h.stats(client)
    waiting = asyncio.ensure_future(
        client.text_document_inline_completion_async(h.inline_params(0, 11, uri, invoked=False))
    )
    await asyncio.sleep(0.3)
    held = await h.stats(client)
    assert delta(before, held, "requests") == 1 and delta(before, held, "answered") == 0
    assert delta(before, held, "decodes") == 0  # still in its debounce, nothing decoded
    invoked = await h.inline(client, 0, 11, uri=uri)  # answered without waiting out 10 s
    assert (await asyncio.wait_for(waiting, h.ANSWER_TIMEOUT_S)).items == ()
    after = await settled(client, before, decodes=1)
    assert delta(before, after, "superseded") == 1 and delta(before, after, "decodes") == 1
    assert len(invoked.items) <= 1


async def test_shutdown_answers_a_request_in_flight():
    client, _ = await h.start_initialized(options=LONG)
    uri = "file:///work/inflight.py"
    h.open_document(client, "def f(x):\n    return x", uri=uri)
    pending = asyncio.ensure_future(client.text_document_inline_completion_async(h.inline_params(1, 12, uri)))
    await asyncio.sleep(0.5)
    assert await h.stop(client) == 0
    with pytest.raises(JsonRpcRequestCancelled):
        await asyncio.wait_for(pending, h.ANSWER_TIMEOUT_S)
