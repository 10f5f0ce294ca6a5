"""pygls' protocol with the guarantees a completion server needs: every request gets an answer.

This is the one module that touches pygls' private members (``_send_response``,
``_request_futures``, ``_shutdown``, ``_workspace``, ``_handle_cancel_notification``,
``_handle_response``, ``Workspace._create_text_document`` and ``_sync_kind``, the server's
``_stop_event``); ``tests/lsp_server/test_pygls_private.py`` fails loudly on a pygls that moves one of them,
and ``pyproject.toml`` pins the pygls versions they were checked against.

pygls 2.1 leaves three kinds of request unanswered, so a client would wait on them forever:
- params that fail to deserialize (a negative line, a missing field): the error is raised while
  parsing, before pygls knows it was a request, and only logged;
- requests before ``initialize``: handled as if initialized (and failing on the missing workspace);
- requests after ``shutdown``: dropped silently.
They get InvalidParams, ServerNotInitialized and InvalidRequest errors here. A body that is not
valid UTF-8 would also be dropped unparsed; ``Utf8RepairingReader`` replaces the bad bytes.

One frame with a Content-Length shorter than its body used to end the conversation: the rest of
the body runs into the next frame's header line, pygls' header pattern must match a whole line,
so that frame is skipped, and so is every one after it (each body, having no line break, runs
into the next header). The readers here cut such a line back to its ``Content-Length:``, so the
stream finds its frames again after one bad frame.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInvalidParams,
    JsonRpcInvalidRequest,
    JsonRpcServerNotInitialized,
)
from pygls.protocol import LanguageServerProtocol
from pygls.server import JsonRPCServer
from pygls.workspace import TextDocument, Workspace

from speculative_complete.lsp_server import request_log
from speculative_complete.lsp_server.documents import LspTextDocument

log = logging.getLogger(__name__)


@dataclass
class MalformedRequest:
    """A request whose params did not match the method's schema; answered with InvalidParams."""

    id: Any
    method: str
    reason: str
    jsonrpc: str = "2.0"


@dataclass
class MalformedNotification:
    """A notification whose params did not match the method's schema: logged and dropped (there
    is nobody to answer; pygls would show the user an "Error in server" message)."""

    method: str
    reason: str
    jsonrpc: str = "2.0"


def _explain(exc: BaseException) -> str:
    """cattrs' validation error as short lines: ``Position.line should be in range ... @ params.position``."""
    cause = exc.__cause__ or exc
    try:
        from cattrs.v import format_exception, transform_error

        def describe(error: BaseException, expected: type | None) -> str:
            if isinstance(error, ValueError) and str(error):  # lsprotocol's validators say it best
                return str(error)
            return format_exception(error, expected)

        details = [line.replace("@ $.", "@ ") for line in transform_error(cause, "$", describe)]
        return "; ".join(details[:5]) if details else str(cause)
    except Exception:
        return str(cause) or type(cause).__name__


def with_default_params(data: Any) -> Any:
    """``data`` with the params JSON-RPC lets a client leave out, filled in as null.

    Neovim omits ``params`` when a plugin passes nil, and pygls' generic message types require the
    field, so ``lsp_server/stats`` without params was InvalidParams. Absent means null: a method
    with optional params accepts it, one whose params are required still gets InvalidParams. For
    the same reason ``workspace/executeCommand``'s optional ``arguments`` becomes ``[]``: pygls
    would call the command with none and answer InternalError instead of checking the count."""
    if not isinstance(data, dict) or "method" not in data:
        return data
    if "params" not in data:
        data = {**data, "params": None}
    params = data["params"]
    if (
        data["method"] == types.WORKSPACE_EXECUTE_COMMAND
        and isinstance(params, dict)
        and params.get("arguments") is None
    ):
        data = {**data, "params": {**params, "arguments": []}}
    return data


def _is_request(message: Any) -> bool:
    """A request (it has a method and an id), not a notification or a response."""
    return getattr(message, "method", None) is not None and hasattr(message, "id")


class CompletionProtocol(LanguageServerProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_received = False

    def structure_message(self, data: dict[str, Any]) -> Any:
        data = with_default_params(data)
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and isinstance(data.get("method"), str):
                if "id" in data:
                    return MalformedRequest(id=data["id"], method=data["method"], reason=_explain(exc))
                return MalformedNotification(method=data["method"], reason=_explain(exc))
            raise

    def handle_message(self, message: Any) -> None:
        """Each request is handled, and answered or refused, in a context that names it: its log
        lines carry its id (``request_log``), also those of the tasks and jobs it starts."""
        if _is_request(message):
            with request_log.serving(message.id):
                self._route(message)
        else:
            self._route(message)

    def _route(self, message: Any) -> None:
        if isinstance(message, MalformedNotification):
            log.warning("dropped %s notification with invalid params: %s", message.method, message.reason)
            return
        if isinstance(message, MalformedRequest):
            log.warning("invalid params for %s: %s", message.method, message.reason)
            self._reject(
                message.id, JsonRpcInvalidParams(f"invalid params for {message.method}: {message.reason}")
            )
            return
        method = getattr(message, "method", None)
        is_request = _is_request(message)
        if method == types.INITIALIZE:
            self.initialize_received = True
        elif method is not None and not self.initialize_received and method != types.EXIT:
            if is_request:
                self._reject(
                    message.id,
                    JsonRpcServerNotInitialized(
                        f"the server is not initialized: send 'initialize' before {method!r}"
                    ),
                )
            else:
                log.warning("dropped notification %r received before initialize", method)
            return
        if method == types.TEXT_DOCUMENT_DID_CHANGE and not self._is_open(message):
            # pygls would raise a KeyError and show it to the user as "Error in server".
            log.warning("didChange for %s, which is not open: ignored", message.params.text_document.uri)
            return
        if is_request and self._shutdown:
            self._reject(
                message.id,
                JsonRpcInvalidRequest(f"the server is shutting down: {method!r} refused after 'shutdown'"),
            )
            return
        super().handle_message(message)

    def _is_open(self, message: Any) -> bool:
        uri = message.params.text_document.uri
        return self._workspace is not None and unquote(uri) in self._workspace.text_documents

    def _reject(self, msg_id: Any, error: JsonRpcException) -> None:
        self._send_response(msg_id, error=error.to_response_error())

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        """A cancel that crossed its request's answer on the wire is routine (editors cancel at
        every keystroke) and LSP says to ignore it; pygls logs a warning, which Neovim copies
        into its LSP log as an error. An id that is no id at all (a list) is dropped the same way."""
        if not isinstance(msg_id, (int, str)) or msg_id not in self._request_futures:
            log.debug("$/cancelRequest for %s: already answered", msg_id)
            return
        super()._handle_cancel_notification(msg_id)

    def _handle_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        """A response to a request the server stopped waiting for (it gives the client a few
        seconds to answer window/workDoneProgress/create) is dropped; pygls would fail resolving
        the cancelled future and show the user an "Error in server" message."""
        future = self._request_futures.get(msg_id)
        if future is not None and future.done():
            del self._request_futures[msg_id]
            log.debug("response to request %s after the server stopped waiting: dropped", msg_id)
            return
        super()._handle_response(msg_id, result, error)


class LspWorkspace(Workspace):
    def _create_text_document(
        self,
        doc_uri: str,
        source: str | None = None,
        version: int | None = None,
        language_id: str | None = None,
    ) -> TextDocument:
        return LspTextDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self.position_codec,
        )


def use_lsp_line_model(workspace: Workspace) -> None:
    """Make ``workspace`` create ``LspTextDocument``s; call it before any document is opened.

    pygls builds its ``Workspace`` inside its own initialize handler, so the class is switched on
    the instance (``LspWorkspace`` adds no state) rather than constructing a second one.
    """
    if not isinstance(workspace, LspWorkspace):
        workspace.__class__ = LspWorkspace


def stop_with(server: JsonRPCServer, event: threading.Event) -> None:
    """Make pygls' ``shutdown()`` set ``event`` (it ends the read loop of a transport we run)."""
    server._stop_event = event


HEADER = b"Content-Length:"


def _resync(line: bytes) -> bytes:
    """A header line, without the bytes a wrong Content-Length left before it."""
    at = line.find(HEADER)
    if at > 0:
        log.warning("skipped %d bytes before a Content-Length header (a frame's length was wrong)", at)
        return line[at:]
    return line


def _repair(body: bytes) -> bytes:
    try:
        body.decode("utf-8")
        return body
    except UnicodeDecodeError:
        log.warning("message body is not valid UTF-8; replacing the invalid bytes")
        return body.decode("utf-8", "replace").encode("utf-8")


class Utf8RepairingStdin:
    """A binary stdin for pygls' reader whose message bodies are always valid UTF-8."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def readline(self) -> bytes:
        return _resync(self._stream.readline())

    def read(self, size: int) -> bytes:
        return _repair(self._stream.read(size))


class Utf8RepairingReader:
    """The same for an ``asyncio.StreamReader`` (TCP)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def readline(self) -> bytes:
        return _resync(await self._reader.readline())

    async def readexactly(self, size: int) -> bytes:
        try:
            return _repair(await self._reader.readexactly(size))
        except asyncio.IncompleteReadError:  # the client went away mid-message
            return b""
