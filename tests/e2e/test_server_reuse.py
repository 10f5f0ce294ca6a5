"""Reuse across keystrokes through the real server process on the real model (its default
quantized weights): KV-cache reuse, typed-ahead answers from the document's greedy chain,
repeated requests, prefetch.

Every check compares against a second server with all reuse off (no KV cache kept, nothing
remembered, no prefetch): the same edits must give the same suggestions, token for token; the
reusing server must only be faster, which the stats show as reused prompt tokens and answers
that needed no target pass."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types

from tests.support import lsp as h

pytestmark = [pytest.mark.real_model, pytest.mark.asyncio(loop_scope="module")]

ROOMY = {"timeBudgetMs": 120000, "debounceMs": 0}
REUSE_OFF = {**ROOMY, "kvCacheMb": 0, "typeAhead": False, "prefetch": False}
CODE = """import os


def read_config(path):
    with open(path) as handle:
        lines = handle.readlines()
    values = {}
    for line in lines:
        key, value = line.split("=", 1)
        values[key.strip()] = value.strip()
    return values


def write_config(path, values):
    with open(path, "w") as handle:
        for key, value in values.items():
            handle.write"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers():
    reusing, _ = await h.start_initialized(model=h.DEFAULT, options=ROOMY)
    plain, _ = await h.start_initialized(model=h.DEFAULT, options=REUSE_OFF)
    yield reusing, plain
    await h.stop(reusing)
    await h.stop(plain)


class Doc:
    """One document opened in both servers, edited identically in both."""

    def __init__(self, servers, uri: str, text: str) -> None:
        self.servers, self.uri, self.text, self.version = servers, uri, text, 1
        for client in servers:
            h.open_document(client, text, uri=uri)

    def offset(self, line: int, character: int) -> int:
        lines = self.text.split("\n")
        return sum(len(x) + 1 for x in lines[:line]) + character

    def position(self, offset: int) -> tuple[int, int]:
        before = self.text[:offset]
        return before.count("\n"), len(before) - (before.rfind("\n") + 1)

    def edit(self, start: int, end: int, new: str) -> None:
        self.version += 1
        for client in self.servers:
            h.edit(client, self.uri, self.version, self.position(start), self.position(end), new)
        self.text = self.text[:start] + new + self.text[end:]

    def close(self) -> None:
        for client in self.servers:
            client.text_document_did_close(
                types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=self.uri))
            )

    def reopen(self) -> None:
        self.version = 1
        for client in self.servers:
            h.open_document(client, self.text, uri=self.uri)

    async def ask(self, offset: int) -> tuple[str | None, str | None]:
        """The suggestion from each server at ``offset`` (None: no suggestion)."""
        line, character = self.position(offset)
        answers = []
        for client in self.servers:
            answer = await h.inline(client, line, character, uri=self.uri)
            answers.append(answer.items[0].insert_text if answer.items else None)
        return answers[0], answers[1]


async def test_the_same_edits_give_the_same_suggestions_with_reuse_on_and_off(servers):
    reusing, _ = servers
    doc = Doc(servers, "file:///work/config_io.py", CODE)
    before = await h.stats(reusing)
    seen = []

    async def check(label: str, offset: int) -> None:
        got, want = await doc.ask(offset)
        assert got == want, f"{label}: reuse gave {got!r}, a fresh decode {want!r}"
        seen.append((label, got))

    end = len(doc.text)
    await check("end of file", end)
    for ch in "(f":  # typing on at the cursor
        doc.edit(end, end, ch)
        end += 1
        await check(f"typed {ch!r}", end)
    # An edit before the cursor: rename a variable in the first function.
    at = doc.text.index("values = {}")
    doc.edit(at, at + len("values"), "settings")
    await check("edit before the cursor", len(doc.text))
    doc.edit(at, at + len("settings"), "values")  # undo
    await check("undo", len(doc.text))
    # A cursor in the middle of the file, after the indentation of a new line.
    middle = doc.text.index("    return values") + len("    return values")
    doc.edit(middle, middle, "\n    ")
    await check("new line mid-file", middle + 5)
    doc.edit(middle, middle + 5, "")  # and back
    doc.close()
    doc.reopen()
    await check("closed and reopened", len(doc.text))
    after = await h.stats(reusing)
    assert after["kv_cache"]["reused_tokens"] > before["kv_cache"]["reused_tokens"]
    assert after["kv_cache"]["reused_share"] > 0.3, after["kv_cache"]
    assert any(text for _, text in seen), seen


async def test_typing_the_suggestion_is_answered_without_a_target_pass_and_as_the_model_would(servers):
    reusing, _ = servers
    doc = Doc(servers, "file:///work/typing_along.py", CODE)
    end = len(doc.text)
    first, want = await doc.ask(end)
    assert first == want and first, first
    before = await h.stats(reusing)
    shown, along = first, 0
    for typed, ch in enumerate(first[:6], start=1):
        along += int(shown.startswith(ch))  # the key typed is the start of the suggestion on screen
        doc.edit(end + typed - 1, end + typed - 1, ch)
        got, fresh = await doc.ask(end + typed)
        assert got == fresh, f"after typing {first[:typed]!r}: {got!r} vs a fresh decode's {fresh!r}"
        shown = got or ""
    after = await h.stats(reusing)
    gained = {k: after["reuse"][k] - before["reuse"][k] for k in after["reuse"]}
    # Every keystroke along the suggestion on screen was recognised as typed-ahead (the model may
    # change its mind once healing sees a token's last character: then the next key is not
    # along it), and most were answered from the greedy chain with no target pass at all.
    assert gained["typed_ahead"] == along >= 3, gained
    assert gained["from_chain"] >= along - 2, gained
    assert after["known_tokens"] > before["known_tokens"]


async def test_typing_on_inside_a_healed_word_is_answered_without_a_target_pass(servers):
    """Mid-word each keystroke asks with the same prompt (healing backs it up to the word's start)
    and a longer text the suggestion must begin with. Here the model would write ``write`` after
    ``handle.``, so healing ``f`` overrides its choice and nothing it wrote is on its greedy
    chain; typing the suggestion's next letters is still answered from that answer, as a fresh
    decode would answer it."""
    reusing, _ = servers
    text = CODE.removesuffix("write") + "f"
    doc = Doc(servers, "file:///work/mid_word.py", text)
    end = len(doc.text)
    first, want = await doc.ask(end)
    assert first == want and first, first
    before = await h.stats(reusing)
    shown = first
    for typed in range(1, 3):
        ch = shown[0]
        doc.edit(end + typed - 1, end + typed - 1, ch)
        got, fresh = await doc.ask(end + typed)
        assert got == fresh and got, f"after typing {ch!r}: {got!r} vs a fresh decode's {fresh!r}"
        shown = got
    after = await h.stats(reusing)
    assert after["reuse"]["from_chain"] - before["reuse"]["from_chain"] == 2, (before, after)
    assert after["known_tokens"] > before["known_tokens"]


async def test_a_repeated_request_is_answered_from_memory(servers):
    reusing, _ = servers
    doc = Doc(servers, "file:///work/repeat.py", CODE)
    first, _ = await doc.ask(len(doc.text))
    before = await h.stats(reusing)
    again, _ = await doc.ask(len(doc.text))
    after = await h.stats(reusing)
    assert again == first
    assert after["reuse"]["repeated"] == before["reuse"]["repeated"] + 1
    assert after["decodes"] == before["decodes"]  # no decode at all


async def test_prefetch_answers_the_next_line_after_the_suggestion_is_accepted(servers):
    reusing, _ = servers
    # A body whose lines share an indentation, so an editor's auto-indent is what the model expects.
    text = "def area(width, height):\n    width = abs(width)\n    "  # next: height = abs(height)
    doc = Doc(servers, "file:///work/prefetch.py", text)
    # Earlier tests' documents may have been prefetched already: wait for one more, this one's.
    prefetched = (await h.stats(reusing))["prefetch"]["completed"]
    suggestion, want = await doc.ask(len(doc.text))
    assert suggestion == want and suggestion
    deadline = time.monotonic() + h.ANSWER_TIMEOUT_S * 2
    while (await h.stats(reusing))["prefetch"]["completed"] <= prefetched:  # decoded ahead when idle
        assert time.monotonic() < deadline, "no prefetch ran"
        await asyncio.sleep(0.2)
    before = await h.stats(reusing)
    # Accept the suggestion and press Enter; the editor indents the new line like the last one.
    doc.edit(len(doc.text), len(doc.text), suggestion + "\n    ")
    got, fresh = await doc.ask(len(doc.text))
    after = await h.stats(reusing)
    assert got == fresh
    assert after["reuse"]["from_chain"] == before["reuse"]["from_chain"] + 1, "not served by the prefetch"
