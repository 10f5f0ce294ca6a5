"""The process and the protocol edge: CLI, stdout hygiene, requests before initialize, malformed
input, the shutdown/exit sequence, a vanished client, and the TCP transport."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest
from lsprotocol import types

from tests.support import lsp as h

INVALID_PARAMS, INVALID_REQUEST, NOT_INITIALIZED = -32602, -32600, -32002
INLINE = "textDocument/inlineCompletion"


def inline(uri: str = h.URI, line: int = 0, character: int = 0) -> dict:
    return {
        "textDocument": {"uri": uri},
        "position": {"line": line, "character": character},
        "context": {"triggerKind": 1},
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "speculative_complete.lsp_server", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_version_and_help_exit_zero_and_name_every_flag():
    version = run_cli("--version")
    assert version.returncode == 0 and re.match(r"lsp_server \S+", version.stdout)
    usage = run_cli("--help")
    assert usage.returncode == 0
    for flag in (
        "--stdio",
        "--tcp",
        "--model",
        "--draft-model",
        "--drafter",
        "--device",
        "--dtype",
        "--log-level",
        "--log-file",
        "--version",
    ):
        assert flag in usage.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--device", "tpu"], "argument --device: 'tpu': expected auto, cpu"),
        (["--dtype", "int4"], "argument --dtype: 'int4': expected one of auto"),
        (["--tcp", "localhost"], "argument --tcp: expected HOST:PORT"),
        (["--drafter", "magic"], "argument --drafter: invalid choice: 'magic'"),
        (["--drafter", "model"], "--drafter model needs --draft-model"),
        (["--model", ""], "argument --model: '': expected a non-empty string"),
        (["--stdio", "--tcp", "localhost:1"], "argument --tcp: not allowed with argument --stdio"),
    ],
)
def test_bad_command_line_values_exit_2_with_a_message(args, says):
    result = run_cli(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert f"lsp_server: error: {says}" in result.stderr


async def test_requests_before_initialize_get_server_not_initialized():
    server = await h.RawServer.start()
    try:
        for msg_id, method in enumerate((INLINE, h.STATS, "shutdown")):
            answer = await server.request(msg_id, method, inline() if method == INLINE else None)
            assert answer["error"]["code"] == NOT_INITIALIZED
            assert "initialize" in answer["error"]["message"]
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": h.URI, "languageId": "python", "version": 1, "text": "x"}},
        )  # dropped, no crash
        assert "capabilities" in (await server.initialize(msg_id=5))["result"]
    finally:
        await server.kill()


async def test_requests_while_the_model_loads_get_an_empty_answer():
    server = await h.RawServer.start()
    try:
        await server.initialize()
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": h.URI, "languageId": "python", "version": 1, "text": "total = price *"}},
        )
        answer = await server.request(1, INLINE, inline(character=15))
        status = (await server.request(2, h.STATS))["result"]["model"]["status"]
        if status == "loading":  # importing torch alone takes seconds, so this is the usual case
            assert answer["result"] == {"items": []}
        assert (await server.wait_model())["model"]["loaded"]
    finally:
        await server.kill()


async def test_malformed_params_and_bytes_get_an_answer_and_the_server_stays_up():
    server = await h.RawServer.start()
    try:
        await server.initialize()
        broken = [
            {**inline(), "position": {"line": -1, "character": 0}},
            {"position": {"line": 0, "character": 0}, "context": {"triggerKind": 1}},
            {**inline(), "position": {"line": "zero", "character": 0}},
            None,
        ]
        for msg_id, params in enumerate(broken, start=1):
            answer = await server.request(msg_id, INLINE, params)
            assert answer["error"]["code"] == INVALID_PARAMS, answer
            assert answer["error"]["message"].startswith(f"invalid params for {INLINE}")
            if msg_id == 1:
                assert "Position.line should be in range" in answer["error"]["message"]
                assert answer["error"]["message"].endswith("@ params.position")
        server.send(b'{"jsonrpc": "2.0", "id": 50, "method": ')  # not JSON: nothing to answer
        bad_utf8 = (
            b'{"jsonrpc": "2.0", "id": 51, "method": "textDocument/inlineCompletion", '
            b'"params": {"textDocument": {"uri": "file:///caf\xe9.py"}, '
            b'"position": {"line": 0, "character": 0}, "context": {"triggerKind": 1}}}'
        )
        server.send(bad_utf8)
        assert (await server.response(51))["result"] == {"items": []}  # an unknown document
        assert "result" in await server.request(52, h.STATS)
    finally:
        await server.kill()


async def test_shutdown_then_exit_ends_the_process_with_code_0_even_if_stdin_stays_open():
    server = await h.RawServer.start()
    await server.initialize()
    assert (await server.request(1, "shutdown"))["result"] is None
    refused = await server.request(2, INLINE, inline())
    assert refused["error"]["code"] == INVALID_REQUEST
    server.notify("exit")
    assert await server.exit_code() == 0  # stdin is still open: the client did not close it


async def test_exit_without_shutdown_ends_with_code_1():
    server = await h.RawServer.start()
    await server.initialize()
    server.notify("exit")
    assert await server.exit_code() == 1


async def test_the_process_exits_when_stdin_closes_even_in_the_middle_of_a_decode():
    server = await h.RawServer.start()
    try:
        await server.initialize(
            {"maxNewTokens": 2000, "multiline": True, "timeBudgetMs": 0, "firstAnswerMs": 0}
        )
        assert (await server.wait_model())["model"]["loaded"]
        server.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": h.URI,
                    "languageId": "python",
                    "version": 1,
                    "text": "def f(x):\n    return x",
                }
            },
        )
        server.send({"jsonrpc": "2.0", "id": 7, "method": INLINE, "params": inline(line=1, character=12)})
        await asyncio.sleep(0.5)
        stats = (await server.request(8, h.STATS))["result"]
        assert stats["requests"] == 1 and stats["answered"] == 0  # decoding right now
        server.process.stdin.close()
        assert await server.exit_code() == 0
    finally:
        await server.kill()


async def test_logs_stay_off_stdout_even_at_debug_level(tmp_path):
    log_file = tmp_path / "server.log"
    server = await h.RawServer.start("--log-level", "debug", "--log-file", str(log_file))
    try:
        await server.initialize()
        await server.wait_model()  # every frame read so far parsed as LSP
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": h.URI, "languageId": "python", "version": 1, "text": "print('hi')"}},
        )
        assert "result" in await server.request(3, INLINE, inline(character=11))
        await server.request(4, "shutdown")
        server.notify("exit")
        assert await server.exit_code() == 0
        logged = log_file.read_text()
        assert "loaded on cpu" in logged and "inline file:///work/example.py 0:11" in logged
    finally:
        await server.kill()


async def test_tcp_transport_serves_one_client_and_exits_after_it():
    command = h.server_command()
    command[command.index("--stdio")] = "--tcp"
    command.insert(command.index("--tcp") + 1, "127.0.0.1:0")
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    try:
        port = None
        while port is None:
            line = await asyncio.wait_for(process.stderr.readline(), h.ANSWER_TIMEOUT_S)
            assert line, "the server exited before listening"
            found = re.search(rb"listening on 127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        drain = asyncio.ensure_future(process.stderr.read())  # keep the pipe from filling up
        client = h.make_test_lsp_client()
        await client.start_tcp("127.0.0.1", port)
        result = await asyncio.wait_for(
            client.initialize_session(types.InitializeParams(capabilities=h.capabilities())),
            h.ANSWER_TIMEOUT_S,
        )
        assert result.capabilities.inline_completion_provider is not None
        await h.wait_model(client)
        h.open_document(client, "total = price *")
        answer = await h.inline(client, 0, 15)
        assert len(answer.items) <= 1
        await asyncio.wait_for(client.shutdown_async(None), h.ANSWER_TIMEOUT_S)
        client.exit(None)
        assert await asyncio.wait_for(process.wait(), 15) == 0
        await drain
        await client.stop()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


ARENA_PROBE = """
import ctypes, os, sys, threading
if sys.argv[1] == "one":
    from speculative_complete.lsp_server.__main__ import one_malloc_arena
    one_malloc_arena()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
def allocate():
    for _ in range(50):
        libc.malloc(64 * 1024)  # below the mmap threshold: served by the thread's arena
threads = [threading.Thread(target=allocate) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_the_server_allocates_from_one_malloc_arena():
    """Threads that allocate get arenas of their own by default; the server keeps one (less
    resident memory after a load: the note in ``one_malloc_arena``)."""

    def arenas(mode: str, env: dict[str, str]) -> int:
        done = subprocess.run(
            [sys.executable, "-c", ARENA_PROBE, mode], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert arenas("default", env) > 1
    assert arenas("one", env) == 1
    assert arenas("one", {**env, "MALLOC_ARENA_MAX": "3"}) > 1  # the user's setting wins
