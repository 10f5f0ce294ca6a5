"""The replay's llama-server client without llama.cpp: its prompt window and its abort-on-keystroke.

A fake llama-server on loopback stands in (``/tokenize`` counts words, ``/completion`` streams a
few chunks slowly), so nothing is built or loaded; each test takes well under a second."""

from __future__ import annotations

import asyncio
import json

from benchmarks.replay import (
    LLAMA_SUFFIX_CHARS,
    LlamaServerClient,
    PromptWindow,
    _offset,
    choose_window_start,
)


async def count_words(text: str) -> int:
    return len(text.split())


def numbered_lines(n: int) -> str:
    return "".join(f"line {i} has five words\n" for i in range(n))  # 5 "tokens" a line


async def test_the_window_starts_at_the_earliest_line_start_that_fits():
    text = numbered_lines(100) + "def f("
    start = await choose_window_start(text, count_words, 50)
    assert start == 0 or text[start - 1] == "\n"
    assert await count_words(text[start:]) <= 50
    earlier = text.rfind("\n", 0, start - 1) + 1
    assert await count_words(text[earlier:]) > 50
    # a cursor line longer than the budget: its own start, over budget
    long_line = numbered_lines(3) + "x " * 80
    assert await choose_window_start(long_line, count_words, 50) == len(numbered_lines(3))


async def test_the_window_start_holds_while_typing_fits_and_moves_once_it_would_not():
    window = PromptWindow(count_words, budget=60, reserve=20)
    before = numbered_lines(100)
    first = await window.prompt(before)
    start = window.start
    assert await count_words(first) <= 40 and window.choices == 1
    typed = ""
    for word in ["alpha"] * 15:  # 15 more words: 55 tokens, still within 60
        typed += word + " "
        assert (await window.prompt(before + typed)).startswith(first)
        assert window.start == start
    assert window.choices == 1
    for word in ["beta"] * 10:  # past 60: a new start, later in the text, within the budget again
        typed += word + " "
        prompt = await window.prompt(before + typed)
    assert window.choices == 2 and window.start > start
    assert await count_words(prompt) <= 60
    window.reset()
    await window.prompt(before)
    assert window.choices == 3 and window.start == start


def test_lsp_positions_map_to_string_offsets_in_utf16_units():
    text = "ab\nx\U0001f600y\nz"
    assert _offset(text, 0, 2) == 2
    assert _offset(text, 1, 0) == 3
    assert _offset(text, 1, 3) == 5  # the emoji is two UTF-16 units
    assert _offset(text, 2, 1) == len(text)


class FakeLlamaServer:
    """Streams ``words`` chunks at ``delay`` each; records prompts and which streams were cut off."""

    def __init__(self, words: int = 4, delay: float = 0.05) -> None:
        self.words, self.delay = words, delay
        self.prompts: list[str] = []
        self.requests: list[tuple[str, dict]] = []  # (path, body) of each completion request
        self.cut_off = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readline()).split()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        body = json.loads(await reader.readexactly(int(headers["content-length"])))
        if request[1] == b"/tokenize":
            data = json.dumps({"tokens": list(range(len(body["content"].split())))}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
            await writer.drain()
            writer.close()
            return
        self.prompts.append(body["prompt"])
        self.requests.append((request[1].decode(), body))
        assert body["stream"] and body["cache_prompt"] and body["stop"] == ["\n"]
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            for i in range(self.words):
                await asyncio.sleep(self.delay)
                if reader.at_eof() or (i and await _closed(reader)):
                    self.cut_off += 1
                    return
                last = i == self.words - 1
                event = {"content": f"w{i} ", "stop": last}
                if last:
                    event["timings"] = {"prompt_n": 3, "cache_n": 7, "prompt_ms": 1.0, "predicted_ms": 2.0}
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            self.cut_off += 1
        finally:
            writer.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), 0.001) == b""
    except TimeoutError:
        return False


async def test_each_keystroke_aborts_the_request_in_flight_and_the_last_one_answers(tmp_path):
    fake = FakeLlamaServer()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    client = LlamaServerClient("llama_server", {"contextTokens": 64}, tmp_path / "unused.gguf")
    client.server.port = server.sockets[0].getsockname()[1]
    try:
        uri = "file:///x.py"
        await client.open(uri, numbered_lines(40) + "\n", (40, 0))
        client.insert(uri, 2, 40, 0, "d")
        first = client.request(uri, 40, 1)
        await asyncio.sleep(0.08)  # mid-stream
        client.insert(uri, 3, 40, 1, "e")
        second = client.request(uri, 40, 2)
        answer = await asyncio.wait_for(second, 5)
        await asyncio.sleep(0.1)
        assert first.cancelled()
        assert answer.items[0].insert_text == "w0 w1 w2 w3 "
        assert fake.prompts[-1].endswith("line 39 has five words\nde") and fake.prompts[0].endswith("\nd")
        assert fake.prompts[0].split("\n")[0] == fake.prompts[1].split("\n")[0]  # a stable prompt start
        assert fake.cut_off == 1
        stats = await client.stats()
        assert stats["aborted"] == 1 and stats["answered"] == 1
        assert stats["kv_cache"]["reused_share"] == 0.7
    finally:
        server.close()
        await server.wait_closed()


async def test_llama_infill_sends_the_cursors_line_as_the_prompt_and_whole_lines_after_it(tmp_path):
    """``llama_infill`` drives ``/infill`` as llama.vim does: the window's lines above the cursor's
    as ``input_prefix``, the cursor's line so far as ``prompt``, the rest of that line and whole
    lines after it, within ``LLAMA_SUFFIX_CHARS``, as ``input_suffix``."""
    fake = FakeLlamaServer(words=2, delay=0.01)
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    client = LlamaServerClient("llama_infill", {"contextTokens": 64}, tmp_path / "unused.gguf")
    client.server.port = server.sockets[0].getsockname()[1]
    try:
        uri, after = "file:///x.py", "(x)\n" + numbered_lines(60)
        await client.open(uri, numbered_lines(40) + "def f" + after, (40, 5))
        answer = await asyncio.wait_for(client.request(uri, 40, 5), 5)
        assert answer.items[0].insert_text == "w0 w1 "
        ((path, body),) = fake.requests
        assert path == "/infill" and body["prompt"] == "def f"
        assert body["input_prefix"].endswith("line 39 has five words\n")
        suffix = body["input_suffix"]
        assert after.startswith(suffix) and suffix.endswith("\n") and "(x)\nline 0 has" in suffix
        assert len(suffix) <= LLAMA_SUFFIX_CHARS < len(suffix) + len("line 99 has five words\n")
    finally:
        server.close()
        await server.wait_closed()
