"""Keystroke replay: real code typed at a human pace through the real server, configurations side by side.

What a user feels is the time from a keystroke to the suggestion, and whether the suggestion is
what they were about to type. This benchmark replays exactly that. Each file of the corpus is
opened with a stretch of lines cut out of it, and the stretch is typed back character by
character: a `didChange` per keystroke, and an automatic `textDocument/inlineCompletion` request
after each one, never cancelled by the client (as Neovim does; the server must supersede). Enter
inserts the newline and the next line's indentation at once, as an editor's auto-indent does.
The pace is seeded and human-like: a base rate with jitter, longer pauses after punctuation and
at line ends.

Every configuration replays the same keystrokes at the same times, one server process each, the
files interleaved (file 1 in every configuration, then file 2, ...), so the machine's load hits
all of them alike; speed is reported as ratios against the baseline measured in the same run.

For each request it records the time to the answer, whether a newer keystroke had already made it
stale, and whether the suggestion matched the rest of the line the user went on to type (exactly,
and as characters saved: the common prefix). The headline numbers are over requests at typing
pauses (the next keystroke at least ``--pause-ms`` later), which are the ones a user waits on.

The configuration ``llama_server`` is not our server: it replays the same keystrokes against
llama.cpp's ``llama-server`` on the same GGUF (``benchmarks/llama_server.py`` builds it once), as a
good editor plugin drives it: each keystroke aborts the request in flight and sends a new
``/completion`` (greedy, prompt cache on, stop at the newline) with the text before the cursor,
windowed to the same token budget from a start chosen once per file. ``llama_infill`` sends
``/infill`` instead, as llama.vim does: the window's lines above the cursor's as ``input_prefix``,
the cursor's line so far as ``prompt`` (after the middle marker), and whole lines after the cursor
as ``input_suffix``, within about our suffix's share of the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from benchmarks import llama_server
from benchmarks.decode_bench import stdlib_files, write_json
from speculative_complete.lsp_server.stats import process_memory

log = logging.getLogger("benchmarks.replay")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "replay.json"
STATS = "lsp_server/stats"
CONFIGS: dict[str, dict[str, Any]] = {
    # The server as shipped: every default.
    "shipped": {},
    # The baseline: plain greedy generation on the full prompt, nothing kept between keystrokes.
    "baseline": {"drafter": "none", "kvCacheMb": 0, "typeAhead": False, "prefetch": False},
    # A peer decoding path: transformers' generate(prompt_lookup_num_tokens=10) on the full prompt.
    "hf_prompt_lookup": {
        "decoder": "transformers",
        "drafter": "ngram",
        "kvCacheMb": 0,
        "typeAhead": False,
        "prefetch": False,
        "quantization": "none",
    },
    # Ablations, to see where the gain comes from.
    "speculation_only": {"kvCacheMb": 0, "typeAhead": False, "prefetch": False},
    "reuse_only": {"drafter": "none"},
    "no_workspace": {"workspaceIndexMb": 0},  # with --workspace: shipped without the workspace index
    "cross_file": {"crossFileContext": True},  # shipped with other files' definitions and edits
    "no_head": {"draftHead": "none"},  # shipped without the draft head
    "transformers_forward": {"quantization": "none"},  # shipped on transformers' forward (dequantized)
    # The peer server: llama.cpp's llama-server on the same GGUF, driven by LlamaServerClient (these
    # settings are not sent anywhere; maxNewTokens and contextTokens from --options apply to it).
    "llama_server": {},
    # The same with llama-server's /infill as llama.vim drives it (a model with FIM tokens only).
    "llama_infill": {},
}
LLAMA_PEERS = ("llama_server", "llama_infill")
WORKSPACE_KEYS = ("files", "tokens", "index_bytes", "drafts", "proposed", "accepted")
DEFAULT_CONFIGS = "shipped,baseline,hf_prompt_lookup,llama_server"
PUNCTUATION_PAUSE = set("(),:.=[]{}")
ANSWER_GUARD_S = 120.0  # a hang guard for the run, not a latency expectation


# -- the typing script ------------------------------------------------------------------------------
@dataclass
class Keystroke:
    at_s: float  # seconds after the replay's start
    text: str  # inserted at the cursor (one character, or a newline plus indentation)


@dataclass
class Segment:
    """A stretch of a file to type back: the document starts as ``head + tail``."""

    file: str
    head: str
    typed: str
    tail: str


def pick_segment(rel: str, text: str, rng: random.Random, lines: int) -> Segment | None:
    """``lines`` consecutive lines with code on most of them, after at least 30 lines of context."""
    all_lines = text.splitlines(keepends=True)
    if len(all_lines) < 40 + lines:
        return None
    for _ in range(20):
        start = rng.randrange(30, len(all_lines) - lines)
        chunk = all_lines[start : start + lines]
        code = [line for line in chunk if line.strip() and not line.strip().startswith(("#", '"', "'"))]
        if len(code) >= lines * 0.7 and max(len(line) for line in chunk) < 100:
            # Typing starts after the first line's indentation, where an editor leaves the cursor.
            first = chunk[0]
            indent = first[: len(first) - len(first.lstrip())]
            head = "".join(all_lines[:start]) + indent
            typed = "".join(chunk)[len(indent) :].rstrip("\n")
            tail = "\n" + "".join(all_lines[start + lines :])
            return Segment(rel, head, typed, tail)
    return None


def typing_script(typed: str, cps: float, rng: random.Random) -> list[Keystroke]:
    """Keystrokes with human-like timing; Enter brings the next line's indentation with it."""
    keys: list[Keystroke] = []
    now, i = 0.5, 0
    base = 1.0 / cps
    while i < len(typed):
        ch = typed[i]
        if ch == "\n":
            j = i + 1
            while j < len(typed) and typed[j] in " \t":
                j += 1
            now += rng.uniform(0.6, 1.4)  # a pause at the end of a line: reading, thinking
            keys.append(Keystroke(now, typed[i:j]))
            i = j
            continue
        now += base * rng.lognormvariate(0.0, 0.35)
        if keys and keys[-1].text[-1:] in PUNCTUATION_PAUSE and rng.random() < 0.5:
            now += rng.uniform(0.25, 0.6)
        keys.append(Keystroke(now, ch))
        i += 1
    return keys


# -- one request's record ---------------------------------------------------------------------------
@dataclass
class RequestRecord:
    config: str
    file: str
    key: int  # index of the keystroke the request followed
    sent_s: float
    latency_ms: float | None  # None: no answer before the run's guard ran out (should not happen)
    stale: bool  # a newer keystroke was sent before the answer arrived
    at_pause: bool  # the next keystroke came at least --pause-ms later (or never)
    suggestion: str | None
    rest_of_line: str  # what the user went on to type on this line
    exact: bool
    saved_chars: int  # common prefix of the suggestion and the rest of the line


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# -- the client -------------------------------------------------------------------------------------
class ReplayClient:
    """The real server process over stdio, driven with pygls' own client."""

    def __init__(
        self,
        name: str,
        options: dict[str, Any],
        model: str | None,
        workspace: Path | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.name, self.options, self.model, self.workspace = name, options, model, workspace
        self.log_dir = log_dir  # where the server writes its debug log (each answer's phases)
        self.client = LanguageClient("replay", "1")

    async def start(self) -> None:
        args = [sys.executable, "-m", "speculative_complete.lsp_server", "--stdio", "--log-level", "WARNING"]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = self.log_dir / f"{self.name}.log"
            log_file.unlink(missing_ok=True)  # the server appends
            args[-1] = "DEBUG"
            args += ["--log-file", str(log_file)]
        if self.model:
            args += ["--model", self.model]
        await self.client.start_io(*args)
        caps = self.capabilities()
        folders = None
        if self.workspace is not None:
            folders = [types.WorkspaceFolder(uri=self.workspace.as_uri(), name=self.workspace.name)]
        await asyncio.wait_for(
            self.client.initialize_async(
                types.InitializeParams(
                    capabilities=caps, initialization_options=self.options, workspace_folders=folders
                )
            ),
            ANSWER_GUARD_S,
        )
        self.client.initialized(types.InitializedParams())
        deadline = time.monotonic() + 600
        while (await self.stats())["model"]["status"] != "ready":
            if (await self.stats())["model"]["status"] == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the model did not load: {(await self.stats())['model']}")
            await asyncio.sleep(0.2)
        await self._workspace_indexed(deadline)
        self.ready_memory = (await self.stats()).get("process") or {}

    def capabilities(self) -> types.ClientCapabilities:
        """What the client says it supports: inline completion only (a subclass may add more)."""
        return types.ClientCapabilities(
            text_document=types.TextDocumentClientCapabilities(
                inline_completion=types.InlineCompletionClientCapabilities()
            )
        )

    async def _workspace_indexed(self, deadline: float) -> None:
        """Type only once the workspace index is built (a user's session is long past that)."""
        drafts = self.options.get("drafter") != "none" and self.options.get("decoder") != "transformers"
        wanted = self.workspace is not None and self.options.get("workspaceIndexMb", 1) > 0 and drafts
        while wanted:
            index = (await self.stats())["workspace_index"]
            if index["scanned"] and not index["pending"]:
                log.warning("%s: workspace indexed: %s", self.name, index)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the workspace was not indexed: {index}")
            await asyncio.sleep(0.2)

    async def stats(self) -> dict[str, Any]:
        result = await asyncio.wait_for(self.client.protocol.send_request_async(STATS, {}), ANSWER_GUARD_S)
        return _plain(result)

    async def memory(self) -> dict[str, Any]:
        """Resident MB when ready (before the first file), at the end, and at the peak."""
        now = (await self.stats()).get("process") or {}
        return {
            "ready_rss_mb": self.ready_memory.get("rss_mb"),
            "end_rss_mb": now.get("rss_mb"),
            "peak_rss_mb": now.get("peak_rss_mb"),
        }

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), 30)
            self.client.exit(None)
        finally:
            await self.client.stop()

    async def open(self, uri: str, text: str, cursor: tuple[int, int]) -> None:
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
            )
        )

    def close(self, uri: str) -> None:
        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    def insert(self, uri: str, version: int, line: int, character: int, text: str) -> None:
        at = types.Position(line, character)
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[
                    types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)
                ],
            )
        )

    def request(self, uri: str, line: int, character: int) -> asyncio.Future:
        automatic = types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)
        params = types.InlineCompletionParams(
            context=automatic,
            position=types.Position(line, character),
            text_document=types.TextDocumentIdentifier(uri=uri),
        )
        return asyncio.ensure_future(self.client.text_document_inline_completion_async(params))


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# -- the peer: llama.cpp's llama-server, driven like an editor plugin -----------------------------
LLAMA_CONTEXT_TOKENS = 512  # the prompt's token budget: our server's contextTokens default
LLAMA_RESERVE_TOKENS = 128  # room left for typing when a window start is chosen
LLAMA_MAX_NEW_TOKENS = 64  # our server's maxNewTokens default
LLAMA_SUFFIX_CHARS = LLAMA_CONTEXT_TOKENS // 4 * 3  # ~a quarter of the budget, at ~3 characters a token
CHARS_PER_TOKEN_CAP = 16  # no token spans more characters (bounds the text a window search tokenizes)

TokenCounter = Callable[[str], Awaitable[int]]
NEWLINE = re.compile("\n")


async def choose_window_start(text: str, count: TokenCounter, limit: int) -> int:
    """The earliest line start from which the rest of ``text`` fits in ``limit`` tokens.

    The cursor's own line start when even that line is longer (the prompt is then over budget)."""
    floor = max(0, len(text) - limit * CHARS_PER_TOKEN_CAP)
    starts = [0] if floor == 0 else []
    starts += [m.end() for m in NEWLINE.finditer(text, floor)]
    if not starts:
        return 0
    lo, hi = 0, len(starts) - 1  # starts[hi] is the answer if nothing earlier fits
    while lo < hi:
        mid = (lo + hi) // 2
        if await count(text[starts[mid] :]) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return starts[lo]


class PromptWindow:
    """The text before the cursor, from a line start chosen once and kept while the prompt fits.

    The start is chosen so the prompt takes ``budget - reserve`` tokens; typing grows it, and only
    when it would pass ``budget`` (estimated from the characters typed since) is a new start chosen.
    A stable start is the best case for llama-server's prompt cache."""

    def __init__(
        self, count: TokenCounter, budget: int = LLAMA_CONTEXT_TOKENS, reserve: int = LLAMA_RESERVE_TOKENS
    ) -> None:
        self.count, self.budget, self.reserve = count, budget, min(reserve, budget // 2)
        self.start: int | None = None
        self.choices = 0  # how many times a start was chosen
        self._tokens = 0  # the window's tokens when its start was chosen
        self._end = 0  # where the text before the cursor ended then

    def reset(self) -> None:
        self.start = None

    def estimate(self, before: str) -> float:
        assert self.start is not None
        per_token = (self._end - self.start) / self._tokens if self._tokens else 4.0
        return self._tokens + (len(before) - self._end) / max(per_token, 1.0)

    async def prompt(self, before: str) -> str:
        if self.start is None or len(before) < self._end or self.estimate(before) > self.budget:
            self.start = await choose_window_start(before, self.count, self.budget - self.reserve)
            self._tokens, self._end = await self.count(before[self.start :]), len(before)
            self.choices += 1
        return before[self.start :]


async def _http(
    port: int,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    stream: Callable[[bytes], bool] | None = None,
) -> tuple[int, bytes]:
    """One HTTP/1.1 request on its own loopback connection, closed when done or cancelled.

    With ``stream``, each piece of the body is handed to it as it arrives until it returns True."""
    reader, writer = await asyncio.open_connection(llama_server.HOST, port)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {llama_server.HOST}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        received = bytearray()
        async for piece in _body(reader, headers):
            received += piece
            if stream is not None and stream(piece):
                break
        return status, bytes(received)
    finally:
        writer.close()  # on cancellation too: llama-server stops generating for a closed connection


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]):
    if "chunked" in headers.get("transfer-encoding", ""):
        while (size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16)) > 0:
            yield await reader.readexactly(size)
            await reader.readline()
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while piece := await reader.read(65536):
            yield piece


class LlamaServerClient:
    """llama-server on the same GGUF, with the replay's client interface (documents kept here).

    Like llama.vscode at its best: every keystroke aborts the request in flight (its connection is
    closed, so the server stops generating) and sends a new streamed ``/completion``: greedy, prompt
    cache on, ``n_predict`` 64, stopping at the newline, on the text before the cursor in a
    ``PromptWindow``. An aborted request answers nothing (the editor shows nothing), when aborted."""

    def __init__(self, name: str, options: dict[str, Any], model: Path, threads: int = 2) -> None:
        self.name, self.model = name, model
        self.infill = name == "llama_infill"
        self.max_new_tokens = int(options.get("maxNewTokens", LLAMA_MAX_NEW_TOKENS))
        self.server = llama_server.LlamaServer(model, threads=threads)
        self.window = PromptWindow(self.tokens, int(options.get("contextTokens", LLAMA_CONTEXT_TOKENS)))
        self.documents: dict[str, str] = {}
        self.in_flight: asyncio.Task | None = None
        self.counts = {"requests": 0, "answered": 0, "aborted": 0, "failed": 0}
        self.timings: list[dict[str, Any]] = []

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)
        self.ready_memory = self._process_memory()

    def _process_memory(self) -> dict[str, float | None]:
        process = self.server.process
        return process_memory(process.pid) if process is not None else {}

    async def memory(self) -> dict[str, Any]:
        """Resident MB when ready (the model loaded), at the end and at the peak, as for ours."""
        now = self._process_memory()
        return {
            "ready_rss_mb": self.ready_memory.get("rss_mb"),
            "end_rss_mb": now.get("rss_mb"),
            "peak_rss_mb": now.get("peak_rss_mb"),
        }

    async def stop(self) -> None:
        if self.in_flight is not None:
            self.in_flight.cancel()
        await asyncio.to_thread(self.server.stop)

    async def tokens(self, text: str) -> int:
        status, body = await _http(self.server.port, "POST", "/tokenize", {"content": text})
        if status != 200:
            raise RuntimeError(f"llama-server /tokenize: HTTP {status}: {body[:300]!r}")
        return len(json.loads(body)["tokens"])

    async def open(self, uri: str, text: str, cursor: tuple[int, int]) -> None:
        """A new file: the window's start is chosen now, before the first keystroke."""
        self.documents[uri] = text
        self.window.reset()
        await self.window.prompt(text[: _offset(text, *cursor)])

    def close(self, uri: str) -> None:
        self.documents.pop(uri, None)

    def insert(self, uri: str, version: int, line: int, character: int, text: str) -> None:
        document = self.documents[uri]
        at = _offset(document, line, character)
        self.documents[uri] = document[:at] + text + document[at:]

    def request(self, uri: str, line: int, character: int) -> asyncio.Future:
        if self.in_flight is not None and not self.in_flight.done():
            self.in_flight.cancel()
            self.counts["aborted"] += 1
        document = self.documents[uri]
        at = _offset(document, line, character)
        self.counts["requests"] += 1
        self.in_flight = asyncio.ensure_future(self._complete(document[:at], document[at:]))
        return self.in_flight

    async def _complete(self, before: str, after: str) -> types.InlineCompletionList:
        prompt = await self.window.prompt(before)
        path, body = "/completion", {"prompt": prompt}
        if self.infill:
            line = prompt.rfind("\n") + 1
            path, body = (
                "/infill",
                {
                    "input_prefix": prompt[:line],
                    "prompt": prompt[line:],
                    "input_suffix": _suffix_lines(after, LLAMA_SUFFIX_CHARS),
                },
            )
        content: list[str] = []
        final: dict[str, Any] = {}
        pending = bytearray()

        def on_piece(piece: bytes) -> bool:  # server-sent events: "data: {json}" blocks
            pending.extend(piece)
            while b"\n\n" in pending:
                event, _, rest = bytes(pending).partition(b"\n\n")
                pending[:] = rest
                for line in event.splitlines():
                    if line.startswith(b"data: "):
                        chunk = json.loads(line[6:])
                        content.append(chunk.get("content", ""))
                        if chunk.get("stop"):
                            final.update(chunk)
                            return True
            return False

        status, answer = await _http(
            self.server.port,
            "POST",
            path,
            {
                **body,
                "n_predict": self.max_new_tokens,
                "temperature": 0.0,
                "top_k": 1,
                "stop": ["\n"],
                "cache_prompt": True,
                "stream": True,
            },
            stream=on_piece,
        )
        if status != 200 or not final:
            self.counts["failed"] += 1
            raise RuntimeError(f"llama-server {path}: HTTP {status}: {answer[:300]!r}")
        self.counts["answered"] += 1
        self.timings.append({**final.get("timings", {}), "tokens_cached": final.get("tokens_cached")})
        text = "".join(content).removesuffix("\n")  # the stop string is not sent; a newline, just in case
        items = [types.InlineCompletionItem(insert_text=text)] if text else []
        return types.InlineCompletionList(items=items)

    async def stats(self) -> dict[str, Any]:
        """The replay's stats shape where it applies: prompt tokens served from llama-server's cache."""
        cached = sum(t.get("cache_n") or 0 for t in self.timings)
        evaluated = sum(t.get("prompt_n") or 0 for t in self.timings)

        def mean(key: str) -> float | None:
            values = [t[key] for t in self.timings if t.get(key) is not None]
            return round(sum(values) / len(values), 2) if values else None

        reused = round(cached / (cached + evaluated), 4) if cached + evaluated else None
        return {
            **self.counts,
            "binary": str(self.server.binary),
            "model": {"path": str(self.model)},
            "window_choices": self.window.choices,
            "kv_cache": {"reused_share": reused, "reused_tokens": cached, "prefilled_tokens": evaluated},
            "phases_ms": {"prefill": {"mean": mean("prompt_ms")}, "decode": {"mean": mean("predicted_ms")}},
            "tokens_predicted_mean": mean("predicted_n"),
        }


def _suffix_lines(after: str, chars: int) -> str:
    """The text after the cursor: the rest of its line and whole lines after it, within ``chars``."""
    end = after.find("\n") + 1 or len(after)
    while end < len(after):
        following = after.find("\n", end) + 1 or len(after)
        if following > chars:
            break
        end = following
    return after[:end]


def _offset(text: str, line: int, character: int) -> int:
    """The string index of an LSP position (``character`` in UTF-16 code units)."""
    start = 0
    for _ in range(line):
        start = text.index("\n", start) + 1
    at, units = start, 0
    while units < character and at < len(text) and text[at] != "\n":
        units += _utf16_len(text[at])
        at += 1
    return at


async def replay_segment(
    client: ReplayClient | LlamaServerClient,
    segment: Segment,
    keys: Sequence[Keystroke],
    number: int,
    pause_ms: float,
) -> list[RequestRecord]:
    """Type ``segment`` into a fresh document on ``client``; one record per request."""
    uri = f"file:///replay/{number}/{Path(segment.file).name}"
    typed = ""
    line = segment.head.count("\n")
    column = _utf16_len(segment.head[segment.head.rfind("\n") + 1 :])
    await client.open(uri, segment.head + segment.tail, (line, column))
    pending: list[tuple[int, float, asyncio.Future, str]] = []
    answered_at: dict[int, float] = {}
    start = time.monotonic()
    for index, key in enumerate(keys):
        delay = key.at_s - (time.monotonic() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        client.insert(uri, index + 2, line, column, key.text)
        typed += key.text
        if "\n" in key.text:
            line += key.text.count("\n")
            column = _utf16_len(key.text.rsplit("\n", 1)[1])
        else:
            column += _utf16_len(key.text)
        rest = segment.typed[len(typed) :].split("\n", 1)[0]
        future = client.request(uri, line, column)
        sent = time.monotonic() - start
        future.add_done_callback(lambda _f, i=index: answered_at.setdefault(i, time.monotonic() - start))
        pending.append((index, sent, future, rest))
    await asyncio.wait([f for _, _, f, _ in pending], timeout=ANSWER_GUARD_S)
    client.close(uri)
    records = []
    for index, sent, future, rest in pending:
        suggestion = None
        if future.done() and not future.cancelled() and future.exception() is None:
            items = future.result().items if future.result() is not None else []
            suggestion = items[0].insert_text if items else None
        answer = answered_at.get(index)
        next_key = keys[index + 1].at_s if index + 1 < len(keys) else math.inf
        stale = answer is None or answer > next_key
        text = suggestion.rstrip() if isinstance(suggestion, str) else None
        records.append(
            RequestRecord(
                config=client.name,
                file=segment.file,
                key=index,
                sent_s=round(sent, 4),
                latency_ms=round((answer - sent) * 1000, 2) if answer is not None else None,
                stale=stale,
                at_pause=(next_key - keys[index].at_s) * 1000 >= pause_ms,
                suggestion=suggestion,
                rest_of_line=rest,
                exact=bool(text) and text == rest.rstrip(),
                saved_chars=common_prefix(text, rest) if text else 0,
            )
        )
    return records


# -- summary ----------------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 1)


def mean_chars(records: Sequence[RequestRecord]) -> float | None:
    return round(sum(len(r.suggestion or "") for r in records) / len(records), 1) if records else None


def shown_by_all(records: Sequence[RequestRecord]) -> set[tuple[str, int]]:
    """The pause keystrokes where every configuration showed a suggestion: the like-for-like set.
    Each configuration's own non-empty answers differ (one shows a block body where another
    shows nothing), so their medians compare different requests."""
    configs = set(r.config for r in records)
    showing: dict[tuple[str, int], set[str]] = {}
    for r in records:
        if r.at_pause and r.suggestion and r.latency_ms is not None:
            showing.setdefault((r.file, r.key), set()).add(r.config)
    return {key for key, names in showing.items() if names == configs}


def summarize(
    records: Sequence[RequestRecord], stats: dict[str, dict[str, Any]], typed_chars: int, baseline: str
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    common = shown_by_all(records)
    for name in dict.fromkeys(r.config for r in records):
        mine = [r for r in records if r.config == name]
        answered = [r.latency_ms for r in mine if r.latency_ms is not None]
        pauses = [r for r in mine if r.at_pause and r.latency_ms is not None]
        shown = [r for r in pauses if r.suggestion]
        shown_common = [r.latency_ms for r in shown if (r.file, r.key) in common]
        s = stats.get(name, {})
        out[name] = {
            "requests": len(mine),
            "unanswered": sum(r.latency_ms is None for r in mine),
            "at_pauses": len(pauses),
            "p50_ms_at_pauses": pct([r.latency_ms for r in pauses], 50),
            "p95_ms_at_pauses": pct([r.latency_ms for r in pauses], 95),
            # the same over the pause answers that showed something (an empty answer can be quick)
            "p50_ms_nonempty_at_pauses": pct([r.latency_ms for r in shown], 50),
            "p95_ms_nonempty_at_pauses": pct([r.latency_ms for r in shown], 95),
            # the same over the pause keystrokes where every configuration showed one
            "shown_by_all_at_pauses": len(shown_common),
            "p50_ms_shown_by_all_at_pauses": pct(shown_common, 50),
            "p50_ms_all": pct(answered, 50),
            "p95_ms_all": pct(answered, 95),
            # suggestion length at pauses: over all answers (empty ones count 0) and over non-empty ones
            "chars_per_answer_at_pauses": mean_chars(pauses),
            "chars_per_nonempty_at_pauses": mean_chars(shown),
            "stale_share": round(sum(r.stale for r in mine) / len(mine), 3) if mine else None,
            "suggestion_share_at_pauses": round(len(shown) / len(pauses), 3) if pauses else None,
            "exact_at_pauses": round(sum(r.exact for r in pauses) / len(pauses), 3) if pauses else None,
            "saved_chars_share": (
                round(sum(r.saved_chars for r in pauses) / typed_chars, 3) if typed_chars else None
            ),
            "tokens_per_pass": s.get("tokens_per_pass"),
            "tokens_per_pass_after_prefill": s.get("tokens_per_pass_after_prefill"),
            "reused_share": (s.get("kv_cache") or {}).get("reused_share"),
            "from_chain": (s.get("reuse") or {}).get("from_chain"),
            "budget_exhausted": s.get("budget_exhausted"),
            "phases_mean_ms": {k: v.get("mean") for k, v in (s.get("phases_ms") or {}).items()},
            # every request job that ran, superseded ones included: its wait for the worker
            "queued_ms": s.get("queued_ms"),
            "workspace_index": {
                k: v for k, v in (s.get("workspace_index") or {}).items() if k in WORKSPACE_KEYS
            },
            "memory": s.get("memory"),
        }
    base = out.get(baseline, {})
    for row in out.values():
        for key in ("p50_ms_at_pauses", "p95_ms_at_pauses"):
            b, v = base.get(key), row.get(key)
            row[f"{key}_x_faster_than_{baseline}"] = round(b / v, 2) if b and v else None
    return out


def format_table(summary: dict[str, dict[str, Any]], baseline: str) -> str:
    cols = [
        ("config", "{}"),
        ("p50 pause ms", "{}"),
        ("p95 pause ms", "{}"),
        ("p50 shown ms", "{}"),
        ("p95 shown ms", "{}"),
        ("p50 shown by all ms", "{}"),
        ("p50 all ms", "{}"),
        ("p95 all ms", "{}"),
        (f"x {baseline} p50", "{}"),
        ("tok/pass", "{}"),
        ("after prefill", "{}"),
        ("reused", "{}"),
        ("chars/ans", "{}"),
        ("exact", "{}"),
        ("saved", "{}"),
        ("stale", "{}"),
    ]
    rows = []
    for name, s in summary.items():
        rows.append(
            [
                name,
                s["p50_ms_at_pauses"],
                s["p95_ms_at_pauses"],
                s["p50_ms_nonempty_at_pauses"],
                s["p95_ms_nonempty_at_pauses"],
                f"{s['p50_ms_shown_by_all_at_pauses']} ({s['shown_by_all_at_pauses']})",
                s["p50_ms_all"],
                s["p95_ms_all"],
                s[f"p50_ms_at_pauses_x_faster_than_{baseline}"],
                s["tokens_per_pass"],
                s["tokens_per_pass_after_prefill"],
                s["reused_share"],
                s["chars_per_answer_at_pauses"],
                s["exact_at_pauses"],
                s["saved_chars_share"],
                s["stale_share"],
            ]
        )
    cells = [[c for c, _ in cols]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells)


def format_phases(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "mean ms per answered decode: "
        + ", ".join(["queue", "prompt", "prefill", "draft", "verify", "decode_other", "postprocess"])
        + " (llama_server: its own prompt and generation timings)"
    ]
    for name, s in summary.items():
        phases = s["phases_mean_ms"]
        lines.append(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in phases.items()))
    lines.append("queued before the worker took it, every request job that ran: p50, p95, max (count)")
    for name, s in summary.items():
        queued = s.get("queued_ms") or {}
        if queued:
            lines.append(f"  {name}: {queued['p50']}, {queued['p95']}, {queued['max']} ({queued['count']})")
    lines.append("resident MB: when ready, at the end, peak")
    for name, s in summary.items():
        memory = s.get("memory") or {}
        values = (memory.get(key) for key in ("ready_rss_mb", "end_rss_mb", "peak_rss_mb"))
        lines.append(f"  {name}: " + ", ".join(map(str, values)))
    return "\n".join(lines)


def plot(path: Path, records: Sequence[RequestRecord], configs: Sequence[str]) -> Path | None:
    """The latency distribution at pauses per configuration (a log-scale box plot with points)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot")
        return None
    data = [[r.latency_ms for r in records if r.config == c and r.at_pause and r.latency_ms] for c in configs]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(configs), 4.2))
    ax.boxplot([d or [float("nan")] for d in data], showfliers=False)
    ax.set_xticks(range(1, len(configs) + 1), list(configs))
    rng = random.Random(0)
    for i, values in enumerate(data, start=1):
        ax.scatter([i + rng.uniform(-0.18, 0.18) for _ in values], values, s=6, alpha=0.45)
    ax.set_yscale("log")
    ax.set_ylabel("keystroke to suggestion at typing pauses (ms)")
    ax.set_title("keystroke replay, same keystrokes for every configuration", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# -- main -------------------------------------------------------------------------------------------
def corpus_files(corpus: Sequence[str]) -> list[tuple[str, Path]]:
    if not corpus:
        return stdlib_files()
    found = []
    for entry in corpus:
        path = Path(entry)
        if path.is_dir():
            found += [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*.py"))]
        elif path.is_file():
            found.append((path.name, path))
        else:
            raise SystemExit(f"replay: no such file or folder: {entry}")
    if not found:
        raise SystemExit("replay: the corpus holds no .py files")
    return found


def sibling_workspace(segments: Sequence[Segment], files: Sequence[tuple[str, Path]], root: Path) -> Path:
    """A workspace folder for ``--workspace``: the other ``.py`` files of each typed file's own
    folder (the project around it), copied under ``root``; never a typed file itself."""
    paths = dict(files)
    typed = {paths[s.file].resolve() for s in segments}
    for segment in segments:
        for sibling in sorted(paths[segment.file].parent.glob("*.py")):
            if sibling.resolve() not in typed:
                target = root / Path(segment.file).parent / sibling.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sibling, target)
    return root


def llama_gguf(model: str | None) -> Path:
    """The GGUF llama-server runs: ``--model`` when it is one, else the embedded model's file."""
    if model is None:
        from speculative_complete.decoding.models.loading import default_gguf_path

        return default_gguf_path()
    if model.endswith(".gguf") and Path(model).is_file():
        return Path(model)
    raise SystemExit(f"replay: the llama_server configuration needs a .gguf model, not {model}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", nargs="*", default=[], help="folders or .py files (default: the stdlib)")
    parser.add_argument("--files", type=int, default=4, help="files to type from (default 4)")
    parser.add_argument("--lines", type=int, default=10, help="lines typed per file (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cps", type=float, default=8.0, help="characters per second (default 8)")
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=300.0,
        help="a request counts as at a pause when the next key comes this much later (300)",
    )
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"comma-separated, from: {', '.join(CONFIGS)} (default {DEFAULT_CONFIGS})",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="the configuration ratios are against (default: baseline, else the first one)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the server's --model (default: the embedded model); llama_server needs a .gguf",
    )
    parser.add_argument("--options", default="{}", help="JSON settings added to every configuration")
    parser.add_argument("--llama-threads", type=int, default=2, help="llama-server's -t (default 2)")
    parser.add_argument(
        "--workspace",
        action="store_true",
        help="give our servers a workspace folder: the typed files' sibling files, not the typed ones",
    )
    parser.add_argument(
        "--server-logs",
        type=Path,
        default=None,
        help="a folder for our servers' debug logs, one per configuration (each answer's phases)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    if not args.configs:
        parser.error("no configuration to run")
    if args.baseline is None:
        args.baseline = "baseline" if "baseline" in args.configs else args.configs[0]
    if args.baseline not in args.configs:
        parser.error(f"the baseline {args.baseline!r} must be one of --configs")
    args.options = json.loads(args.options)
    return args


def pick_segments(args: argparse.Namespace, files: Sequence[tuple[str, Path]]) -> list[Segment]:
    """``--files`` stretches of ``--lines`` lines, from the corpus in a seeded order."""
    rng = random.Random(args.seed)
    segments: list[Segment] = []
    order = list(range(len(files)))
    rng.shuffle(order)
    for i in order:
        rel, path = files[i]
        segment = pick_segment(rel, path.read_text(encoding="utf-8", errors="replace"), rng, args.lines)
        if segment is not None:
            segments.append(segment)
        if len(segments) == args.files:
            break
    return segments


async def run(args: argparse.Namespace) -> dict[str, Any]:
    files = corpus_files(args.corpus)
    segments = pick_segments(args, files)
    scripts = [typing_script(s.typed, args.cps, random.Random(f"{args.seed}:{s.file}")) for s in segments]
    workspace = None
    if args.workspace:
        workspace = sibling_workspace(segments, files, Path(tempfile.mkdtemp(prefix="replay-workspace-")))
    clients: dict[str, ReplayClient | LlamaServerClient] = {
        name: (
            LlamaServerClient(name, args.options, llama_gguf(args.model), args.llama_threads)
            if name in LLAMA_PEERS
            else ReplayClient(
                name, {**CONFIGS[name], **args.options}, args.model, workspace, args.server_logs
            )
        )
        for name in args.configs
    }
    for client in clients.values():
        await client.start()
    records: list[RequestRecord] = []
    try:
        for number, (segment, keys) in enumerate(zip(segments, scripts, strict=True)):
            for offset in range(len(clients)):  # rotate who goes first, so no config always follows a pause
                name = args.configs[(number + offset) % len(args.configs)]
                log.warning(
                    "file %d/%d %s: %s (%d keystrokes)",
                    number + 1,
                    len(segments),
                    segment.file,
                    name,
                    len(keys),
                )
                records += await replay_segment(clients[name], segment, keys, number, args.pause_ms)
                await asyncio.sleep(1.0)  # let its idle-time work finish before the next one starts
        stats = {name: {**await c.stats(), "memory": await c.memory()} for name, c in clients.items()}
    finally:
        for client in clients.values():
            await client.stop()
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
    typed_chars = sum(len(s.typed) for s in segments)
    summary = summarize(records, stats, typed_chars, args.baseline)
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "segments": [
            {"file": s.file, "typed_chars": len(s.typed), "keystrokes": len(k)}
            for s, k in zip(segments, scripts, strict=True)
        ],
        "summary": summary,
        "server_stats": stats,
        "records": [asdict(r) for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    payload = asyncio.run(run(args))
    write_json(args.out, payload)
    records = [RequestRecord(**r) for r in payload["records"]]
    picture = plot(args.out, records, args.configs)
    print(format_table(payload["summary"], args.baseline))
    print(format_phases(payload["summary"]))
    print(f"wrote {args.out}" + (f" and {picture}" if picture else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
