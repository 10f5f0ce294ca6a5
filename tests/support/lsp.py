"""End-to-end helpers: start the real server process and talk LSP to it with pytest-lsp's client.

The fast suite runs the server on a tiny random-weight model that uses the real SmolLM2
tokenizer (saved once per test session), so every mechanism is exercised in milliseconds per
token; its output is gibberish, so tests check mechanics, never content.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pytest_lsp import LanguageClient
from pytest_lsp.client import make_test_lsp_client

ANSWER_TIMEOUT_S = 30.0  # hang guards only: generous on a loaded 2-core machine
LOAD_TIMEOUT_S = 120.0
STATS = "lsp_server/stats"
URI = "file:///work/example.py"
SAMPLE = 'def greet(name):\n    message = "hello " + name\n    return message\n\n\ndef main():\n    '


@functools.cache
def tokenizer_source() -> Path:
    """The default model's cached config and tokenizer folder (it holds tokenizer.json), made by a
    load if absent. Only the default model's: the cache also holds other GGUFs' folders."""
    from speculative_complete.decoding.models.loading import default_gguf_path, metadata_folder

    def find() -> Path | None:
        folder = metadata_folder(default_gguf_path())
        return folder if (folder / "tokenizer.json").is_file() else None

    folder = find()
    if folder is None:
        from speculative_complete.decoding.models.loading import load_model

        load_model("default", device="cpu", dtype="float32")
        folder = find()
    assert folder is not None, "the default model could not be converted"
    return folder


@functools.cache
def tiny_model_dir() -> Path:
    """A tiny random model with the real tokenizer, saved once per test session."""
    from tests.support.tiny_models import save_tiny_model

    root = Path(tempfile.mkdtemp(prefix="lsp-tiny-model-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return save_tiny_model(root / "model", tokenizer_source())


def capabilities(
    encodings: list[str] | None = None, progress: bool = True, configuration: bool = True
) -> types.ClientCapabilities:
    general = None
    if encodings is not None:
        general = types.GeneralClientCapabilities(
            position_encodings=[types.PositionEncodingKind(e) for e in encodings]
        )
    return types.ClientCapabilities(
        general=general,
        window=types.WindowClientCapabilities(work_done_progress=progress),
        workspace=types.WorkspaceClientCapabilities(configuration=configuration),
        text_document=types.TextDocumentClientCapabilities(
            synchronization=types.TextDocumentSyncClientCapabilities(),
            completion=types.CompletionClientCapabilities(),
            inline_completion=types.InlineCompletionClientCapabilities(),
        ),
    )


DEFAULT = "default"  # pass as ``model`` for a command with no --model flag: the embedded model


def server_command(*args: str, model: Path | str | None = None) -> list[str]:
    """The server over stdio with the tiny model, another model, or (``DEFAULT``) no --model flag."""
    if model == DEFAULT:
        return [sys.executable, "-m", "speculative_complete.lsp_server", *args]
    return [
        sys.executable,
        "-m",
        "speculative_complete.lsp_server",
        "--stdio",
        "--model",
        str(model if model is not None else tiny_model_dir()),
        *args,
    ]


async def start(*args: str, model: Path | str | None = None) -> LanguageClient:
    """The server process, connected but not initialized."""
    client = make_test_lsp_client()
    command = server_command(*args, model=model)
    await client.start_io(command[0], *command[1:])
    return client


async def start_initialized(
    *args: str,
    model: Path | str | None = None,
    options: Any = None,
    encodings: list[str] | None = None,
    progress: bool = True,
    wait_for_model: bool = True,
) -> tuple[LanguageClient, types.InitializeResult]:
    client = await start(*args, model=model)
    result = await asyncio.wait_for(
        client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities(encodings, progress),
                initialization_options=options,
                client_info=types.ClientInfo(name="pytest-lsp"),
            )
        ),
        ANSWER_TIMEOUT_S,
    )
    if wait_for_model:
        await wait_model(client)
    return client, result


async def stop(client: LanguageClient) -> int | None:
    """shutdown + exit, and the process' exit code."""
    if client._server is not None and client._server.returncode is None:
        await asyncio.wait_for(client.shutdown_session(), ANSWER_TIMEOUT_S)
    await asyncio.wait_for(client.stop(), ANSWER_TIMEOUT_S)
    return client._server.returncode if client._server is not None else None


def plain(value: Any) -> Any:
    """pygls' client turns JSON objects of unknown requests into namedtuples; make them dicts."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def stats(client: LanguageClient) -> dict[str, Any]:
    return plain(await asyncio.wait_for(client.protocol.send_request_async(STATS, {}), ANSWER_TIMEOUT_S))


async def wait_model(client: LanguageClient, statuses: tuple[str, ...] = ("ready",)) -> dict[str, Any]:
    """Poll the stats until the model's status is one of ``statuses``; the last stats."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        current = await stats(client)
        if current["model"]["status"] in statuses:
            return current
        assert current["model"]["status"] != "failed", f"the model failed to load: {current['model']}"
        assert time.monotonic() < deadline, f"model never reached {statuses}: {current['model']}"
        await asyncio.sleep(0.1)


def open_document(client: LanguageClient, text: str, uri: str = URI, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


def edit(
    client: LanguageClient, uri: str, version: int, start: tuple[int, int], end: tuple[int, int], text: str
) -> None:
    """An incremental change replacing start..end (line, character in negotiated units) with text."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=types.Position(*start), end=types.Position(*end)), text=text
                )
            ],
        )
    )


def inline_params(
    line: int, character: int, uri: str = URI, invoked: bool = True
) -> types.InlineCompletionParams:
    trigger = types.InlineCompletionTriggerKind
    kind = trigger.Invoked if invoked else trigger.Automatic
    return types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=kind),
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line, character),
    )


async def inline(
    client: LanguageClient, line: int, character: int, uri: str = URI, invoked: bool = True
) -> types.InlineCompletionList:
    return await asyncio.wait_for(
        client.text_document_inline_completion_async(inline_params(line, character, uri, invoked)),
        ANSWER_TIMEOUT_S,
    )


async def configure(client: LanguageClient, settings: Any) -> None:
    """didChangeConfiguration, then a stats round trip so the change has been applied."""
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))
    await stats(client)


class RawServer:
    """JSON-RPC by hand, for what a well-behaved client library won't send (bad params, bad bytes,
    requests before initialize) and for watching the process itself (exit codes, closed stdin)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.notifications: list[dict[str, Any]] = []

    @classmethod
    async def start(
        cls,
        *args: str,
        model: Path | str | None = None,
        command: list[str] | None = None,
    ) -> RawServer:
        command = command or server_command(*args, model=model)
        process = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return cls(process)

    def send(self, message: dict[str, Any] | bytes) -> None:
        body = message if isinstance(message, bytes) else json.dumps(message).encode("utf-8")
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def receive(self) -> dict[str, Any]:
        """The next message; fails on anything on stdout that is not an LSP frame."""
        length = None
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), ANSWER_TIMEOUT_S)
            assert line, "the server closed stdout"
            if line == b"\r\n":
                break
            name, _, value = line.decode("ascii").partition(":")
            assert name in ("Content-Length", "Content-Type"), f"not an LSP header: {line!r}"
            if name == "Content-Length":
                length = int(value)
        assert length is not None, "a frame without Content-Length"
        return json.loads(await self.process.stdout.readexactly(length))

    async def request(self, msg_id: int, method: str, params: Any = None) -> dict[str, Any]:
        """Send a request and wait for its response; server requests get a null result meanwhile."""
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return await self.response(msg_id)

    async def response(self, msg_id: int) -> dict[str, Any]:
        while True:
            message = await self.receive()
            if "method" in message and "id" in message:  # e.g. window/workDoneProgress/create
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": None})
            elif "method" in message:
                self.notifications.append(message)
            elif message.get("id") == msg_id:
                return message

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def initialize(self, options: Any = None, msg_id: int = 0) -> dict[str, Any]:
        answer = await self.request(
            msg_id,
            "initialize",
            {
                "processId": None,
                "rootUri": None,
                "initializationOptions": options,
                "capabilities": {"window": {"workDoneProgress": True}},
            },
        )
        self.notify("initialized", {})
        return answer

    async def wait_model(self, msg_id: int = 10_000) -> dict[str, Any]:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while True:
            current = (await self.request(msg_id, STATS))["result"]
            msg_id += 1
            if current["model"]["status"] in ("ready", "failed"):
                return current
            assert time.monotonic() < deadline, "the model never loaded"
            await asyncio.sleep(0.1)

    async def exit_code(self, timeout_s: float = 15.0) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout_s)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
