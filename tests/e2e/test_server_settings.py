"""Settings from initializationOptions, workspace/didChangeConfiguration (pushed and pulled), bad
values, and the model lifecycle they drive: reload, load failure, progress."""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPTIONS = {"lspServer": {"maxNewTokens": 12, "contextTokens": "lots", "surprise": 1}}
DOC_URI = "file:///work/settings.py"


@functools.cache
def second_model() -> Path:
    from tests.support.tiny_models import save_tiny_model

    return save_tiny_model(
        Path(tempfile.mkdtemp(prefix="lsp-tiny-model-2-")) / "model", h.tokenizer_source(), seed=1
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    client, _ = await h.start_initialized(options=OPTIONS)
    h.open_document(client, "def scale(values, factor):\n    return [v * factor for v in values", uri=DOC_URI)
    yield client
    await h.stop(client)


async def settings(client) -> dict:
    return (await h.stats(client))["settings"]


async def eventually(predicate, what: str, timeout_s: float = h.LOAD_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


async def test_initialization_options_apply_and_bad_ones_are_reported(client):
    current = await settings(client)
    assert current["maxNewTokens"] == 12  # nested under "lspServer"
    assert current["contextTokens"] == 512  # "lots" was refused: the default stays
    warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
    assert any("contextTokens = 'lots' ignored" in m and "keeping 512" in m for m in warnings)
    assert any("unknown setting 'surprise'" in m.message for m in client.log_messages)


async def test_enabled_false_gives_empty_answers_and_a_bad_value_keeps_the_old_one(client):
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items  # enabled: an answer
    await h.configure(client, {"enabled": False, "maxNewTokens": 20})
    assert (await settings(client))["maxNewTokens"] == 20
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items == ()
    shown = len(client.messages)
    await h.configure(client, {"lspServer": {"enabled": "no", "maxNewTokens": 0}})
    await eventually(lambda: len(client.messages) > shown, "a message about the bad values")
    message = client.messages[-1].message
    assert "enabled = 'no' ignored: expected true or false; keeping False" in message
    assert "maxNewTokens = 0 ignored" in message and "keeping 20" in message
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items == ()  # still disabled
    await h.configure(client, {})  # the section is gone: back to initializationOptions' values
    current = await settings(client)
    assert current["enabled"] is True and current["maxNewTokens"] == 12
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items


async def test_a_null_settings_payload_makes_the_server_pull_its_section(client):
    client.set_configuration({"maxNewTokens": 5, "drafter": "ngram"}, section="lspServer")
    await h.configure(client, None)
    deadline = time.monotonic() + h.ANSWER_TIMEOUT_S
    while (await settings(client))["maxNewTokens"] != 5:
        assert time.monotonic() < deadline, "the pulled configuration never applied"
        await asyncio.sleep(0.05)
    assert (await settings(client))["drafter"] == "ngram"
    await h.inline(client, 1, 65, uri=DOC_URI)  # the new drafter is built on the worker and used
    await h.configure(client, {"drafter": "model"})  # no draftModel: refused
    assert (await settings(client))["drafter"] == "ngram"
    assert "needs draftModel" in client.messages[-1].message
    await h.configure(client, {})


async def test_changing_the_model_reloads_it_with_progress_and_a_failure_is_shown(client):
    loads = len(client.progress_reports)
    first = (await h.stats(client))["model"]["source"]
    await h.configure(client, {"model": str(second_model())})
    current = await h.wait_model(client)
    assert current["model"]["source"] == str(second_model())
    await eventually(lambda: len(client.progress_reports) == loads + 1, "progress for the reload")
    reports = list(client.progress_reports.values())[-1]
    await eventually(lambda: reports[-1].kind == "end", "the end of the reload's progress")
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items  # the new model answers

    await h.configure(client, {"model": "/nowhere/model"})
    current = await h.wait_model(client, statuses=("failed",))
    assert "model path not found: /nowhere/model" in current["model"]["error"]
    await eventually(lambda: any(m.type == types.MessageType.Error for m in client.messages), "an error")
    error = next(m for m in client.messages if m.type == types.MessageType.Error)
    assert "could not load model '/nowhere/model'" in error.message and "not found" in error.message
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items == ()  # up, and answering empty

    await h.configure(client, {"model": first, "draftHead": "/nowhere/head"})
    current = await h.wait_model(client, statuses=("failed",))
    assert "draft head not found: /nowhere/head" in current["model"]["error"]

    await h.configure(client, {"model": first, "drafter": "head"})  # no head for it: auto instead
    current = await h.wait_model(client)
    assert current["model"]["source"] == first and current["model"]["draft_head"] is None
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items
    await h.configure(client, {"model": first})
    assert (await h.wait_model(client))["model"]["source"] == first
    assert (await h.inline(client, 1, 65, uri=DOC_URI)).items


async def test_a_model_that_fails_at_startup_is_reported_and_the_server_answers_empty():
    client, _ = await h.start_initialized(model="/nowhere/at/all", wait_for_model=False)
    try:
        current = await h.wait_model(client, statuses=("failed",))
        assert "/nowhere/at/all" in current["model"]["error"] and not current["model"]["loaded"]
        await eventually(lambda: client.messages, "the error message")
        assert client.messages[0].type == types.MessageType.Error
        h.open_document(client, "x = 1")
        assert (await h.inline(client, 0, 5)).items == ()
        (reports,) = client.progress_reports.values()
        assert reports[-1].kind == "end" and "failed" in reports[-1].message
    finally:
        assert await h.stop(client) == 0


async def test_a_client_without_progress_support_gets_log_messages_only():
    client, _ = await h.start_initialized(progress=False)
    try:
        assert client.progress_reports == {}
        assert any("loaded on cpu" in m.message for m in client.log_messages)
    finally:
        await h.stop(client)
