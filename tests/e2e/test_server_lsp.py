"""The server process over stdio: capabilities, document sync, ranges in every position encoding,
the completion fallback, and bad input. One server per encoding, shared by the module's tests."""

from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

NON_ASCII = 's = "é😀" + na'  # é: 1 UTF-16 unit / 2 UTF-8 bytes; 😀: 2 units / 4 bytes


def units(text: str, encoding: str) -> int:
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    client, result = await h.start_initialized()
    client.init_result = result
    yield client
    await h.stop(client)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def utf8_client():
    client, result = await h.start_initialized(encodings=["utf-8", "utf-16"])
    client.init_result = result
    yield client
    await h.stop(client)


def only_item(answer: types.InlineCompletionList) -> types.InlineCompletionItem:
    assert len(answer.items) == 1, answer
    item = answer.items[0]
    assert isinstance(item.insert_text, str) and item.insert_text.strip()
    return item


async def test_initialize_advertises_inline_completion_completion_and_incremental_sync(client):
    caps = client.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert caps.position_encoding == types.PositionEncodingKind.Utf16
    sync = caps.text_document_sync
    assert sync.change == types.TextDocumentSyncKind.Incremental and sync.open_close
    assert client.init_result.server_info.name == "lsp_server"


async def test_the_model_load_reports_work_done_progress_and_a_log_message(client):
    (reports,) = client.progress_reports.values()
    kinds = [report.kind for report in reports]
    assert kinds[0] == "begin" and "report" in kinds and kinds[-1] == "end"
    assert "loaded" in reports[-1].message
    assert any("loading model" in m.message for m in client.log_messages)


async def test_incremental_edits_are_applied_and_the_item_replaces_the_rest_of_the_line(client):
    uri = "file:///work/edited.py"
    h.open_document(client, "import os\nvalue = compute\n", uri=uri)
    h.edit(client, uri, 2, (1, 15), (1, 15), "(x, y)")  # value = compute(x, y)
    h.edit(client, uri, 3, (1, 0), (1, 5), "result")  # result = compute(x, y)
    h.edit(client, uri, 4, (2, 0), (2, 0), "total = result.scale")
    item = only_item(await h.inline(client, 1, 21, uri=uri))  # before ")"
    assert item.range == types.Range(start=types.Position(1, 21), end=types.Position(1, 22))
    assert ")" in item.insert_text  # the suffix is kept, not duplicated in front of it
    item = only_item(await h.inline(client, 2, 20, uri=uri))
    assert item.range == types.Range(start=types.Position(2, 20), end=types.Position(2, 20))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8"])
async def test_ranges_are_exact_after_non_ascii_text(client, utf8_client, encoding):
    lsp = client if encoding == "utf-16" else utf8_client
    assert lsp.init_result.capabilities.position_encoding == encoding
    uri = f"file:///work/accents-{encoding}.py"
    h.open_document(lsp, f"# é\n{NON_ASCII})\n", uri=uri)
    # An incremental edit addressed in the negotiated units: "na" -> "name", just after the emoji.
    end_of_na = units(NON_ASCII, encoding)
    h.edit(lsp, uri, 2, (1, end_of_na), (1, end_of_na), "me")
    cursor = units(NON_ASCII + "me", encoding)
    item = only_item(await h.inline(lsp, 1, cursor, uri=uri))
    assert item.range == types.Range(start=types.Position(1, cursor), end=types.Position(1, cursor + 1))
    # A character past the end of the line means the end of the line.
    item = only_item(await h.inline(lsp, 1, cursor + 50, uri=uri))
    assert item.range.start == item.range.end == types.Position(1, cursor + 1)


async def test_utf32_is_negotiated_when_the_client_prefers_it():
    lsp, result = await h.start_initialized(encodings=["utf-32", "utf-16"], wait_for_model=False)
    try:
        assert result.capabilities.position_encoding == types.PositionEncodingKind.Utf32
    finally:
        await h.stop(lsp)


async def test_completion_fallback_is_one_item_whose_edit_covers_what_it_inserts(client):
    uri = "file:///work/completion.py"
    h.open_document(client, "def area(width, height):\n    return width * height)\n", uri=uri)
    params = types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(1, 25)
    )
    answer = await asyncio.wait_for(client.text_document_completion_async(params), h.ANSWER_TIMEOUT_S)
    assert isinstance(answer, types.CompletionList) and answer.is_incomplete
    (item,) = answer.items
    edit = item.text_edit
    assert edit.range == types.Range(start=types.Position(1, 25), end=types.Position(1, 26))
    assert edit.new_text.strip() and item.label.strip()
    assert item.insert_text_format in (None, types.InsertTextFormat.PlainText)


async def test_unknown_and_closed_documents_get_an_empty_answer(client):
    assert (await h.inline(client, 0, 0, uri="file:///never/opened.py")).items == ()
    uri = "file:///work/closed.py"
    h.open_document(client, "x = 1\n", uri=uri)
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert (await h.inline(client, 0, 5, uri=uri)).items == ()
    h.edit(client, uri, 2, (0, 0), (0, 0), "y")  # a change to a closed document is ignored quietly
    await h.stats(client)
    assert not any("Error in server" in m.message for m in client.messages)


async def test_a_line_past_the_end_is_invalid_params_with_a_clear_message(client):
    uri = "file:///work/short.py"
    h.open_document(client, "a = 1\nb = 2\n", uri=uri)
    with pytest.raises(JsonRpcInvalidParams, match=r"line 7 is beyond the end of the document \(3 lines"):
        await h.inline(client, 7, 0, uri=uri)
    (await h.inline(client, 2, 0, uri=uri))  # the empty line after the last line break exists


async def test_a_10_mb_document_is_handled_with_a_bounded_prompt(client):
    uri = "file:///work/huge.py"
    block = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(200))
    text = block * (10_000_000 // len(block) + 1)
    before = await h.stats(client)
    h.open_document(client, text, uri=uri)
    lines = text.count("\n")
    h.edit(client, uri, 2, (lines, 0), (lines, 0), "result = function_7(")
    item = only_item(await h.inline(client, lines, 20, uri=uri))
    assert item.range.start == types.Position(lines, 20)
    h.edit(client, uri, 3, (0, 0), (0, 0), "# header\n")  # an edit at the top of 10 MB
    await h.inline(client, lines + 1, 20, uri=uri)
    after = await h.stats(client)
    assert after["answered"] - before["answered"] == 2 and after["errors"] == before["errors"]


async def test_binary_content_nul_and_non_lsp_line_breaks_keep_positions_right(client):
    uri = "file:///work/binary.py"
    # Form feed, NUL, U+2028 and a lone surrogate: pygls' splitlines would see 4 lines before
    # "value"; LSP (and the client) sees 1.
    text = "a = 1\x0c\x00\u2028\ud800 # junk\nvalue = fo\n"
    h.open_document(client, text, uri=uri)
    h.edit(client, uri, 2, (1, 10), (1, 10), "o(")
    item = only_item(await h.inline(client, 1, 12, uri=uri))
    assert item.range == types.Range(start=types.Position(1, 12), end=types.Position(1, 12))


async def test_invalid_utf8_in_a_message_is_repaired_not_dropped(client):
    body = (
        b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": '
        b'{"uri": "file:///work/latin1.py", "languageId": "python", "version": 1, '
        b'"text": "name = \'caf\xe9\'\\nprint(na"}}}'
    )
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    item = only_item(await h.inline(client, 1, 8, uri="file:///work/latin1.py"))
    assert item.range.start == types.Position(1, 8)


async def test_stats_report_counts_latency_and_the_model(client):
    current = await h.stats(client)
    for key in ("requests", "answered", "cancelled", "superseded", "failed", "empty"):
        assert isinstance(current[key], int)
    assert current["requests"] >= 1 and current["answered"] == current["requests"]
    assert current["latency_ms"]["p50"] > 0 and current["latency_ms"]["p95"] >= current["latency_ms"]["p50"]
    assert current["tokens_per_pass"] >= 1.0
    assert isinstance(current["drafters"], dict)
    model = current["model"]
    assert model["loaded"] and model["device"] == "cpu" and model["dtype"] == "float32"
    assert model["source"] and model["error"] is None
    json.dumps(current)
