"""The context and whole-line behaviour through the real server process.

The tiny-model part checks mechanics (no decode mid-word, bad documents); the ``real_model`` part
checks what the embedded SmolLM2 writes: token healing mid-word, an auto-closed bracket covered by
the item's range, and a block body suggested over several lines.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny():
    client, _ = await h.start_initialized(options={"debounceMs": 0, "maxNewTokens": 8})
    yield client
    await h.stop(client)


async def test_no_decode_in_the_middle_of_a_word(tiny):
    uri = "file:///work/midword.py"
    h.open_document(tiny, "value = compute(x)\n", uri=uri)
    before = await h.stats(tiny)
    answer = await h.inline(tiny, 0, 11, uri=uri)  # value = com|pute(x)
    assert answer.items == ()
    after = await h.stats(tiny)
    assert after["decodes"] == before["decodes"] and after["answered"] == before["answered"] + 1
    (item,) = (await h.inline(tiny, 0, 18, uri=uri)).items  # at the end of the line it decodes
    assert item.range.start == types.Position(0, 18)


async def test_other_languages_and_odd_documents_are_answered(tiny):
    cases = [
        ("file:///work/a.rs", "rust", "fn main() {\n    let x = \n}\n", (1, 12)),
        ("file:///work/b.go", "go", "package main\n\nfunc main() {\n\tfmt.\n}\n", (3, 5)),
        ("file:///work/c.unknownext", "plaintext", "notes\n\n- first\n- ", (3, 2)),
        ("file:///work/d.c", "c", "\x00\x01\x02 #include <\n\xff\xfe", (0, 14)),
    ]
    before = await h.stats(tiny)
    for uri, language, text, (line, character) in cases:
        tiny.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)
            )
        )
        answer = await h.inline(tiny, line, character, uri=uri)
        for item in answer.items:
            assert item.insert_text.strip() and item.range.start == types.Position(line, character)
    after = await h.stats(tiny)
    assert after["failed"] == before["failed"] and after["answered"] == before["answered"] + len(cases)


# -- the real model --------------------------------------------------------------------------------------

ENCODER = Path(sysconfig.get_paths()["stdlib"]) / "json" / "encoder.py"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real():
    # The whole block at once (no first-answer budget): this checks what the model writes, not how
    # fast a loaded machine writes it.
    options = {"timeBudgetMs": 60000, "firstAnswerMs": 0, "debounceMs": 0}
    client, _ = await h.start_initialized(model=h.DEFAULT, options=options)
    yield client
    await h.stop(client)


@pytest.mark.real_model
async def test_token_healing_mid_word_through_the_server(real):
    source = ENCODER.read_text()
    start = source.index("yield from _iterencode_dict(o, _current_indent_level)")
    cursor = start + len("yield from _iterencode_dic")
    text = source[:cursor] + source[source.index("\n", cursor) :]  # the user is writing this line
    uri = "file:///work/encoder.py"
    h.open_document(real, text, uri=uri)
    line = text.count("\n", 0, cursor)
    column = cursor - (text.rfind("\n", 0, cursor) + 1)
    (item,) = (await h.inline(real, line, column, uri=uri)).items
    assert item.insert_text == "t(o, _current_indent_level)"  # without healing: "(o, ..." (the t lost)
    assert item.range == types.Range(start=types.Position(line, column), end=types.Position(line, column))


@pytest.mark.real_model
async def test_an_auto_closed_bracket_is_covered_not_repeated(real):
    uri = "file:///work/circle.py"
    text = "import math\n\n\ndef area(radius):\n    return math.pi * math.pow()\n"
    h.open_document(real, text, uri=uri)
    (item,) = (await h.inline(real, 4, 30, uri=uri)).items  # math.pow(|)
    assert item.insert_text == "radius, 2)"
    assert item.range == types.Range(start=types.Position(4, 30), end=types.Position(4, 31))


@pytest.mark.real_model
async def test_an_empty_block_body_gets_a_multi_line_suggestion_that_ends_with_the_block(real):
    uri = "file:///work/fib.py"
    text = "def fibonacci(n):\n    \n\n\nprint(fibonacci(10))\n"
    h.open_document(real, text, uri=uri)
    (item,) = (await h.inline(real, 1, 4, uri=uri)).items
    lines = item.insert_text.split("\n")
    assert len(lines) >= 2 and all(line.startswith("    ") for line in lines[1:])  # inside the body
    assert "print(" not in item.insert_text and "fibonacci(n - 1)" in item.insert_text
    assert item.range == types.Range(start=types.Position(1, 4), end=types.Position(1, 4))
