"""The LSP handlers. Each one translates between LSP types and the modules that do the work.

Document sync (open, incremental change, close) and position-encoding negotiation are pygls'
built-ins; completion logic is in ``completion.py``, model loading in ``lifecycle.py`` and
``model_host.py``, settings rules in ``config.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server import __version__, lifecycle
from lsp_server.completion import ACCEPTED_COMMAND, Completion, CompletionService
from lsp_server.config import SECTION, Layered, Settings, layer
from lsp_server.documents import open_document
from lsp_server.model_host import ModelHost, import_decoding
from lsp_server.protocol import CompletionProtocol, use_lsp_line_model
from lsp_server.scheduler import Scheduler
from lsp_server.stats import ServerStats

if TYPE_CHECKING:
    from lsp_server.remote.health import Notice

log = logging.getLogger(__name__)

STATS_METHOD = "lsp_server/stats"
CONFIG_PULL_TIMEOUT_S = 5.0
LABEL_CHARS = 80


class CompletionServer(LanguageServer):
    """pygls' server plus the state the handlers share: settings, model, scheduler, stats."""

    def __init__(self, cli: Layered) -> None:
        super().__init__(
            name="lsp_server",
            version=__version__,
            protocol_cls=CompletionProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.base_settings = cli.settings  # defaults < CLI
        self.init_settings = cli.settings  # ... < initializationOptions
        self.settings = cli.settings  # ... < workspace/didChangeConfiguration: what is in effect
        self.startup_messages: list[tuple[Layered, str]] = []  # told once the client is initialized
        self.stats = ServerStats()
        self.host = ModelHost()
        self.scheduler = Scheduler()
        self.service = CompletionService(
            self.host,
            self.scheduler,
            self.stats,
            lambda: self.settings,
            lambda: self.workspace.text_documents,
        )
        self.is_initialized = False
        self.shutdown_requested = False
        self.exit_code: int | None = None
        self._load_task: asyncio.Task | None = None
        self._stopped = False

    # -- settings ----------------------------------------------------------------------------------
    def apply_settings(self, lower: Settings, payload: Any, origin: str) -> Settings:
        """Make ``lower`` + ``payload`` the settings in effect; reload the model if it changed."""
        result = layer(self.settings, lower, payload)
        previous, self.settings = self.settings, result.settings
        if previous != self.settings:
            self.service.memory.clear()
        if self.is_initialized:
            self.tell_about(result, origin)
            if previous.model_key() != self.settings.model_key():
                self.start_load()
        else:
            self.startup_messages.append((result, origin))
        return self.settings

    def tell_about(self, result: Layered, origin: str) -> None:
        for line in result.unknown:
            log.warning("%s: %s", origin, line)
            self.window_log_message(
                types.LogMessageParams(
                    type=types.MessageType.Warning, message=f"lsp_server ({origin}): {line}"
                )
            )
        if result.problems:
            message = f"lsp_server ({origin}): " + "; ".join(result.problems)
            log.warning("%s", message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def start_load(self) -> None:
        self.service.memory.clear()  # answers of the previous model must not be replayed
        self._load_task = asyncio.ensure_future(lifecycle.load_model(self, self.host, self.settings))

    def listen_for_notices(self) -> None:
        """A remote engine's outage and recovery, shown once each (``remote/health.py`` decides
        when); the engine notices on its own threads, the message goes out on the event loop."""
        loop = asyncio.get_running_loop()

        def show(notice: Notice) -> None:
            kind = types.MessageType.Warning if notice.kind == "down" else types.MessageType.Info
            message = f"lsp_server: {notice.message}"

            def send() -> None:
                if not self._stopped:
                    self.window_show_message(types.ShowMessageParams(type=kind, message=message))

            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is stopping
                loop.call_soon_threadsafe(send)

        self.host.on_notice = show

    # -- process lifecycle -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the decode worker too; pygls calls this when the connection ends, and so does
        ``__main__``, which then ends the process without waiting for daemon threads (a decode
        step or a model load can't be interrupted)."""
        if self._stopped:
            return
        self._stopped = True
        log.info("stopping")
        self.scheduler.close(timeout_s=0.5)
        self.host.close()
        super().shutdown()


def _inline_items(found: Completion | None) -> types.InlineCompletionList:
    if found is None:
        return types.InlineCompletionList(items=[])
    item = types.InlineCompletionItem(
        insert_text=found.text, range=found.range, command=found.accepted_command()
    )
    return types.InlineCompletionList(items=[item])


def _completion_items(found: Completion | None) -> types.CompletionList:
    # is_incomplete: the answer depends on every character typed, so the client must ask again.
    if found is None:
        return types.CompletionList(is_incomplete=True, items=[])
    label = found.text.strip().splitlines()[0]
    if len(label) > LABEL_CHARS:
        label = label[: LABEL_CHARS - 1] + "…"
    item = types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Text,
        detail="lsp_server: rest of the line",
        sort_text="0",
        filter_text=found.text,
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=found.range, new_text=found.text),
        command=found.accepted_command(),
    )
    return types.CompletionList(is_incomplete=True, items=[item])


def create_server(cli: Layered) -> CompletionServer:
    server = CompletionServer(cli)
    _session_features(server)
    _shutdown_features(server)
    _completion_features(server)
    return server


def _session_features(server: CompletionServer) -> None:
    """Initialization, settings, document close and stats."""

    @server.feature(types.INITIALIZE)
    def initialize(ls: CompletionServer, params: types.InitializeParams) -> None:
        use_lsp_line_model(ls.workspace)
        ls.init_settings = ls.apply_settings(
            ls.base_settings, params.initialization_options, "initializationOptions"
        )
        if ls.settings.endpoint is None:  # torch takes seconds to import: start before the load
            threading.Thread(target=import_decoding, name="preload", daemon=True).start()
        log.info(
            "client %s, position encoding %s",
            params.client_info.name if params.client_info else "unknown",
            ls.workspace.position_encoding,
        )

    @server.feature(types.INITIALIZED)
    def initialized(ls: CompletionServer, params: types.InitializedParams) -> None:
        ls.is_initialized = True
        for result, origin in ls.startup_messages:
            ls.tell_about(result, origin)
        ls.startup_messages.clear()
        ls.listen_for_notices()
        ls.start_load()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(
        ls: CompletionServer, params: types.DidChangeConfigurationParams
    ) -> None:
        payload = params.settings
        if payload is None:  # the pull model: the client wants us to ask
            payload = await _pull_configuration(ls)
            if payload is None:
                return
        ls.apply_settings(ls.init_settings, payload, "workspace/didChangeConfiguration")

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CompletionServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.service.forget(params.text_document.uri)

    @server.feature(STATS_METHOD)
    def stats(ls: CompletionServer, params: Any) -> dict[str, Any]:
        snapshot = ls.stats.snapshot()
        snapshot["prefetch"]["running"] = ls.host.prefetching
        return {
            **snapshot,
            "model": ls.host.state.to_dict(),
            "settings": ls.settings.to_lsp(),
            "kv_cache": ls.host.cache_snapshot(),
            "endpoint": ls.host.endpoint_snapshot(),
            "draft_sources": ls.host.sources.snapshot(),
            "position_encoding": _value(ls.workspace.position_encoding),
            "version": __version__,
        }


def _shutdown_features(server: CompletionServer) -> None:
    """The shutdown sequence: stop every decode, then exit with the spec's code."""

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: CompletionServer, params: Any) -> None:
        # pygls then cancels every other request in flight, and each is answered RequestCancelled.
        ls.shutdown_requested = True
        ls.scheduler.close(timeout_s=0.0)

    @server.feature(types.EXIT)
    def exit_(ls: CompletionServer, params: Any) -> None:
        ls.exit_code = 0 if ls.shutdown_requested else 1  # the spec's exit codes


def _completion_features(server: CompletionServer) -> None:
    """Inline completion (ghost text), the completion-list fallback, and the accepted command."""

    @server.command(ACCEPTED_COMMAND)  # pygls checks the arguments against the signature
    def accepted(ls: CompletionServer, uri: str, text: str) -> None:
        ls.service.accepted(uri, text)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: CompletionServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList:
        uri = params.text_document.uri
        invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
        found = await ls.service.complete(
            "inline", uri, open_document(ls.workspace, uri), params.position, invoked=invoked
        )
        return _inline_items(found)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
    async def completion(ls: CompletionServer, params: types.CompletionParams) -> types.CompletionList:
        uri = params.text_document.uri
        invoked = params.context is None or params.context.trigger_kind == types.CompletionTriggerKind.Invoked
        found = await ls.service.complete(
            "completion", uri, open_document(ls.workspace, uri), params.position, invoked=invoked
        )
        return _completion_items(found)


def _value(enum_or_str: Any) -> Any:
    return getattr(enum_or_str, "value", enum_or_str)


async def _pull_configuration(ls: CompletionServer) -> Any:
    workspace = ls.client_capabilities.workspace if ls.client_capabilities else None
    if not (workspace and workspace.configuration):
        return None
    try:
        request = types.ConfigurationParams(items=[types.ConfigurationItem(section=SECTION)])
        values = await asyncio.wait_for(ls.workspace_configuration_async(request), CONFIG_PULL_TIMEOUT_S)
    except Exception as exc:
        log.warning("workspace/configuration failed: %s", exc or type(exc).__name__)
        return None
    return values[0] if values else None
