"""The soak's process faults, each on a fresh server: the client's stdin closing without ``exit``
in the middle of a decode, and a TCP client dropping its connection mid-request.

Either way the server must end on its own, soon (the issue's bound: 2 s), and leave nothing
behind: the server is started in a session of its own, and no process of that session may
outlive it (a decode worker is a thread, so a leftover would be a real leak).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

from benchmarks.soak_wire import READ_LIMIT, Wire

LONG_DECODE = {
    "maxNewTokens": 4000,
    "timeBudgetMs": 0,
    "firstAnswerMs": 0,  # no early answer of the lines so far: the request stays in flight
    "multiline": "always",
    "maxLines": 1000,
    "debounceMs": 0,
}
# Greedy on the default model and on the tests' tiny random one: seconds of decoding before an
# end-of-generation token (a list the default model ends soon; every control token of the
# vocabulary ends a generation, and the random model writes one within a second after most texts).
TEXT = "x = "
_COPIES: set[asyncio.Future] = set()  # stderr copiers, kept referenced until the process ends
EXIT_GUARD_S = 30.0  # how long to wait at all; the promise checked is the measured time


def session_survivors(session: int) -> list[int]:
    """Pids of live processes in session ``session`` (Linux /proc)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":  # fields[3]: the session id
                alive.append(int(stat.parent.name))
    return alive


async def decode_in_flight(wire: Wire) -> bool:
    """Open a document and start a long decode; whether it is running (asked, not answered)."""
    await wire.initialize(LONG_DECODE)
    await wire.wait_ready()
    uri = "file:///soak/fault.py"
    await wire.notify(
        "textDocument/didOpen",
        {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": TEXT}},
    )
    await wire.request(
        "textDocument/inlineCompletion",
        {
            "textDocument": {"uri": uri},
            "position": {"line": TEXT.count("\n"), "character": len(TEXT.rsplit("\n", 1)[-1])},
            "context": {"triggerKind": 1},
        },
    )
    await asyncio.sleep(0.5)
    stats = (await wire.call("lsp_server/stats", {}))["result"]
    return stats["requests"] == 1 and stats["answered"] == 0


async def ended(process: asyncio.subprocess.Process, since: float) -> dict[str, Any]:
    """Wait for the process to end; its exit code, how long it took, and who outlived it."""
    try:
        code = await asyncio.wait_for(process.wait(), EXIT_GUARD_S)
    except TimeoutError:
        code = None
    seconds = time.monotonic() - since
    survivors = session_survivors(process.pid)
    if code is None:
        process.kill()
        await process.wait()
    return {"exit_code": code, "seconds": round(seconds, 3), "survivors": survivors}


async def stdin_closed(command: list[str], log_path: Path) -> dict[str, Any]:
    wire = await Wire.start(command, log_path)
    decoding = await decode_in_flight(wire)
    since = time.monotonic()
    wire.writer.close()
    return {"decoding_when_closed": decoding, **await ended(wire.process, since)}


async def listening_port(process: asyncio.subprocess.Process, log_path: Path) -> int:
    """The port a ``--tcp HOST:0`` server printed; stderr is copied to ``log_path`` from then on."""
    while True:
        line = await asyncio.wait_for(process.stderr.readline(), 120.0)
        assert line, "the server exited before listening"
        found = re.search(rb"listening on [\d.]+:(\d+)", line)
        if found:
            break

    async def copy() -> None:
        with open(log_path, "ab") as out:
            while chunk := await process.stderr.read(1 << 16):
                out.write(chunk)

    _COPIES.add(asyncio.ensure_future(copy()))
    return int(found.group(1))


async def tcp_dropped(command: list[str], log_path: Path) -> dict[str, Any]:
    tcp = [
        *command[: command.index("--stdio")],
        "--tcp",
        "127.0.0.1:0",
        *command[command.index("--stdio") + 1 :],
    ]
    process = await asyncio.create_subprocess_exec(
        *tcp,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=dict(os.environ),
    )
    port = await listening_port(process, log_path)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=READ_LIMIT)
    wire = Wire(process, reader, writer)
    decoding = await decode_in_flight(wire)
    since = time.monotonic()
    writer.transport.abort()  # no goodbye: the connection is simply gone
    return {"decoding_when_dropped": decoding, **await ended(process, since)}
