"""The soak's LSP client: frames written by hand (so bad ones can be sent too) and an account of
every answer the server gives, by request id.

It answers the server's own requests (``window/workDoneProgress/create``,
``workspace/configuration``) at once, keeps every notification, and fails loudly on anything on
the server's stdout that is not a well-formed LSP frame: stdout is the protocol channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from speculative_complete.lsp_server.stats import process_memory

ABSENT = object()  # a request or notification sent without a "params" member
READ_LIMIT = 1 << 24


def frame(body: bytes, length: int | None = None) -> bytes:
    """One LSP frame; ``length`` other than the body's makes a frame with a wrong Content-Length."""
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def rss_mb(pid: int) -> float | None:
    """The resident set of process ``pid`` in MB (Linux /proc), None when it is gone."""
    return process_memory(pid)["rss_mb"]


CAPABILITIES = {
    "general": {"positionEncodings": ["utf-16"]},
    "window": {"workDoneProgress": True},
    "workspace": {"configuration": True},
    "textDocument": {"inlineCompletion": {}, "completion": {}, "synchronization": {}},
}


def inet_sockets(pid: int) -> int:
    """How many TCP/UDP sockets (IPv4 or IPv6) process ``pid`` holds (Linux /proc); the event
    loop's own socketpair is a Unix socket and does not count."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    held = 0
    for table in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                held += int(len(fields) > 9 and fields[9] in inodes)
    return held


class Wire:
    """One connection to a server process (its stdio, or a TCP socket) and what it said."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader | None = None,
        writer: asyncio.StreamWriter | None = None,
    ) -> None:
        self.process = process
        self.reader = reader or process.stdout
        self.writer = writer or process.stdin
        self.answers: dict[Any, list[dict[str, Any]]] = {}
        self.waiters: dict[Any, asyncio.Future] = {}
        self.sent: dict[int, str] = {}  # id -> method, of every parseable request sent
        self.notifications: list[dict[str, Any]] = []
        self.protocol_errors: list[str] = []  # what on stdout was not an LSP frame
        self.configuration: dict[str, Any] = {}  # answers workspace/configuration
        self._next_id = 1
        self._reader = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def start(cls, command: list[str], stderr_path: Path, env: dict[str, str] | None = None) -> Wire:
        with open(stderr_path, "ab") as stderr:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, **(env or {})},
                limit=READ_LIMIT,
                start_new_session=True,
            )
        return cls(process)

    # -- sending -----------------------------------------------------------------------------------
    async def write(self, data: bytes) -> None:
        """Raw bytes to the server's stdin (a closed pipe is the caller's business to expect)."""
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, message: dict[str, Any]) -> None:
        await self.write(frame(json.dumps(message).encode("utf-8")))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def request(self, method: str, params: Any = ABSENT, msg_id: int | None = None) -> int:
        """Send a request the server can parse (its params may still be wrong); its id."""
        msg_id = self.new_id() if msg_id is None else msg_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not ABSENT:
            message["params"] = params
        self.sent[msg_id] = method
        await self.send(message)
        return msg_id

    async def notify(self, method: str, params: Any = ABSENT) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not ABSENT:
            message["params"] = params
        await self.send(message)

    async def call(self, method: str, params: Any = ABSENT, timeout_s: float = 60.0) -> dict[str, Any]:
        return await self.answer(await self.request(method, params), timeout_s)

    # -- receiving ---------------------------------------------------------------------------------
    async def answer(self, msg_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """The (first) answer to ``msg_id``, waiting up to ``timeout_s`` (a hang guard)."""
        if msg_id in self.answers:
            return self.answers[msg_id][0]
        waiter = self.waiters.setdefault(msg_id, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)

    async def _read_frame(self) -> dict[str, Any] | None:
        length = None
        stdout = self.reader
        while True:
            line = await stdout.readline()
            if not line:
                return None
            if line == b"\r\n":
                break
            name, _, value = line.decode("ascii", "replace").partition(":")
            if name not in ("Content-Length", "Content-Type"):
                self.protocol_errors.append(f"not an LSP header: {line[:200]!r}")
                continue
            if name == "Content-Length":
                length = int(value)
        if length is None:
            self.protocol_errors.append("a frame without Content-Length")
            return {}
        return json.loads(await stdout.readexactly(length))

    async def _read_loop(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while (message := await self._read_frame()) is not None:
                if message:
                    await self._dispatch(message)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message and "id" in message:  # the server asks the client
            result: Any = None
            if message["method"] == "workspace/configuration":
                items = (message.get("params") or {}).get("items") or [{}]
                result = [self.configuration for _ in items]
            with contextlib.suppress(ConnectionError):
                await self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
        elif "method" in message:
            self.notifications.append(message)
        else:
            msg_id = message.get("id")
            self.answers.setdefault(msg_id, []).append(message)
            waiter = self.waiters.get(msg_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)

    # -- the session -------------------------------------------------------------------------------
    async def initialize(self, options: dict[str, Any]) -> None:
        answer = await self.call(
            "initialize",
            {
                "processId": None,
                "rootUri": None,
                "initializationOptions": options,
                "capabilities": CAPABILITIES,
            },
        )
        assert "result" in answer, answer
        await self.notify("initialized", {})

    async def wait_ready(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Poll lsp_server/stats until the model is ready; the last stats."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = (await self.call("lsp_server/stats", {}))["result"]
            if stats["model"]["status"] == "ready":
                return stats
            assert time.monotonic() < deadline, f"the model never got ready: {stats['model']}"
            await asyncio.sleep(0.1)

    async def closed(self) -> None:
        """Wait until the server closed its stdout (the reader has seen everything)."""
        await self._reader
