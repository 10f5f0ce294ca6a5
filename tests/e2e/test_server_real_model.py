"""The embedded SmolLM2 model behind the real server process, started with no flags at all."""

from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.support import lsp as h

pytestmark = [pytest.mark.real_model, pytest.mark.asyncio(loop_scope="module")]

POINT = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y"
URI = "file:///work/point.py"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    # A roomy budget: this checks what the model writes, not how fast a loaded machine is.
    client, _ = await h.start_initialized(model=h.DEFAULT, options={"timeBudgetMs": 60000})
    h.open_document(client, POINT, uri=URI)
    yield client
    await h.stop(client)


async def test_a_sensible_whole_line_completion_after_a_partial_line(client):
    (item,) = (await h.inline(client, 3, 14, uri=URI)).items
    assert item.insert_text.strip() == "= y"
    assert item.range == types.Range(start=types.Position(3, 14), end=types.Position(3, 14))


async def test_after_the_indentation_of_a_new_line_the_next_statement_is_suggested(client):
    h.edit(client, URI, 2, (3, 8), (3, 14), "")  # the cursor sits after 8 spaces of indentation
    (item,) = (await h.inline(client, 3, 8, uri=URI)).items
    assert item.insert_text == "self.y = y"


async def test_the_completion_fallback_offers_the_same_line(client):
    params = types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=URI), position=types.Position(3, 8)
    )
    (item,) = (await client.text_document_completion_async(params)).items
    assert item.text_edit.new_text == "self.y = y" and item.label == "self.y = y"


async def test_stats_have_numbers(client):
    stats = await h.stats(client)
    assert stats["answered"] == stats["requests"] >= 3 and stats["failed"] == 0
    assert stats["tokens_per_pass"] >= 1.0 and stats["latency_ms"]["p50"] > 0
    model = stats["model"]
    assert model["loaded"] and model["source"].endswith(".gguf") and model["device"] == "cpu"
    assert model["dtype"] == "float32" and model["error"] is None
    assert model["quantization"] == "F32+Q4_1+Q8_0"  # the GGUF's own blocks, by default
    assert model["draft_head"].endswith("smollm2-135m-instruct")  # the head shipped for it
    for per in stats["drafters"].values():
        assert per["proposed"] >= per["accepted"] >= 0
    memory = stats["process"]  # the server's own: torch and the model are resident in it
    assert 200 < memory["rss_mb"] <= memory["peak_rss_mb"] < 8192
