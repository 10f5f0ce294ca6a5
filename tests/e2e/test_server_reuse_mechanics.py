"""Reuse mechanics through the server process on the tiny model: the KV-cache memory bound over
many documents, the accepted-item command, other documents as draft sources, and idle-time work
that a request pre-empts."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    client, _ = await h.start_initialized(options={"maxNewTokens": 8, "debounceMs": 0, "timeBudgetMs": 0})
    yield client
    await h.stop(client)


async def eventually(client, check, what: str) -> dict:
    deadline = time.monotonic() + h.ANSWER_TIMEOUT_S
    while True:
        current = await h.stats(client)
        if check(current):
            return current
        assert time.monotonic() < deadline, f"{what} never happened: {current}"
        await asyncio.sleep(0.02)


async def test_the_kv_cache_stays_within_its_budget_over_many_documents(client):
    await h.configure(client, {"maxNewTokens": 8, "debounceMs": 0, "timeBudgetMs": 0, "kvCacheMb": 1})
    for i in range(30):
        uri = f"file:///work/many/doc{i}.py"
        text = "".join(f"def function_{i}_{j}(argument):\n    return argument * {j}\n\n" for j in range(20))
        h.open_document(client, text, uri=uri)
        await h.inline(client, 60, 0, uri=uri)
        cache = (await h.stats(client))["kv_cache"]
        assert cache["bytes"] <= cache["budget_bytes"] == 1 << 20
    cache = (await h.stats(client))["kv_cache"]
    assert cache["evictions"] > 0 and 0 < cache["entries"] < 30


async def test_items_carry_the_accepted_command_and_running_it_feeds_the_drafter(client):
    await h.configure(client, {"maxNewTokens": 8, "debounceMs": 0, "timeBudgetMs": 0})
    uri = "file:///work/accept.py"
    h.open_document(client, "total = compute(", uri=uri)
    (item,) = (await h.inline(client, 0, 16, uri=uri)).items
    assert item.command.command == "lsp_server.accepted"
    assert list(item.command.arguments) == [uri, item.insert_text]
    before = await h.stats(client)
    await asyncio.wait_for(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=item.command.command, arguments=item.command.arguments)
        ),
        h.ANSWER_TIMEOUT_S,
    )
    assert (await h.stats(client))["reuse"]["accepted"] == before["reuse"]["accepted"] + 1
    await h.inline(client, 0, 16, uri=uri)  # an answer lets the worker index it when idle
    await eventually(client, lambda s: s["draft_sources"]["accepted_tokens"] > 0, "indexing the accepted")
    with pytest.raises(JsonRpcInvalidParams):
        await asyncio.wait_for(
            client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="lsp_server.accepted", arguments=[1])
            ),
            h.ANSWER_TIMEOUT_S,
        )


async def test_other_open_documents_become_draft_sources(client):
    h.open_document(client, "def helper(values):\n    return sorted(values)\n", uri="file:///work/helper.py")
    uri = "file:///work/main_module.py"
    h.open_document(client, "from helper import helper\n\nresult = helper(", uri=uri)
    await h.inline(client, 2, 16, uri=uri)
    current = await eventually(client, lambda s: s["draft_sources"]["documents"] >= 2, "indexing")
    assert current["draft_sources"]["tokens"] > 0


async def test_a_request_preempts_idle_time_decoding(client):
    # The tiny model rarely ends a line, so decoding ahead runs long: hundreds of tokens.
    long = {"maxNewTokens": 3000, "debounceMs": 0, "timeBudgetMs": 0}
    for attempt in range(5):
        await h.configure(client, long)
        uri = f"file:///work/preempt{attempt}.py"
        h.open_document(client, "items = [", uri=uri)
        before = (await h.stats(client))["prefetch"]

        def ended(s: dict, before: dict = before) -> bool:
            now = s["prefetch"]
            return now["completed"] > before["completed"] or now["preempted"] > before["preempted"]

        await h.inline(client, 0, 9, uri=uri)  # answered; then the idle worker decodes ahead
        await eventually(client, lambda s: s["prefetch"]["running"] or ended(s), "decoding ahead")
        await h.configure(client, {**long, "maxNewTokens": 1})
        h.edit(client, uri, 2, (0, 9), (0, 9), "1")
        await h.inline(client, 0, 10, uri=uri)  # the user typed on: the work ahead must stop
        after = (await eventually(client, ended, "the decode ahead ending"))["prefetch"]
        if after["completed"] == before["completed"]:
            break  # it was running when the request came, and it stopped
    else:
        pytest.fail("every decode ahead ended before the next request; none to pre-empt")
    assert after["preempted"] > before["preempted"]


async def test_closing_a_document_mid_decode_leaves_nothing_of_it_behind(client):
    # A decode long enough to be caught running on a fast machine: a block, up to 2000 tokens.
    long_decode = {
        "maxNewTokens": 2000,
        "multiline": True,
        "debounceMs": 0,
        "timeBudgetMs": 0,
        "firstAnswerMs": 0,
    }
    await h.configure(client, {**long_decode, "prefetch": False})
    uri = "file:///work/closed_mid_decode.py"
    text = "values = ["
    h.open_document(client, text, uri=uri)
    before = await h.stats(client)
    running = asyncio.ensure_future(
        client.text_document_inline_completion_async(h.inline_params(0, len(text), uri))
    )
    await eventually(client, lambda s: s["kv_cache"]["lent"] > before["kv_cache"]["lent"], "the decode")
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert (await asyncio.wait_for(running, h.ANSWER_TIMEOUT_S)).items == ()  # superseded by the close
    after = await eventually(
        client,
        lambda s: s["kv_cache"]["lent"] == before["kv_cache"]["lent"],
        "the decode giving its cache back",
    )
    assert after["kv_cache"]["entries"] == before["kv_cache"]["entries"]  # its cache was not kept
    # Reopened with the same text, the request is a new one: nothing was remembered of the old.
    h.open_document(client, text, uri=uri)
    await h.configure(client, {"maxNewTokens": 4, "debounceMs": 0, "timeBudgetMs": 0, "prefetch": False})
    await h.inline(client, 0, len(text), uri=uri)
    again = await h.stats(client)
    assert again["reuse"]["repeated"] == before["reuse"]["repeated"]
    assert again["kv_cache"]["reused_tokens"] == after["kv_cache"]["reused_tokens"]  # prefilled afresh
