"""The LSP handlers. Each one translates between LSP types and the modules that do the work.

Document sync (open, incremental change, close) and position-encoding negotiation are pygls'
built-ins; completion logic is in ``completion.py`` (idle-time work in ``idle.py``), model loading in
``lifecycle.py``, ``model_host.py`` and ``local/``, settings rules in ``config.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from speculative_complete.decoding.memory import trim_heap
from speculative_complete.lsp_server import __version__, lifecycle
from speculative_complete.lsp_server.completion import ACCEPTED_COMMAND, Completion, CompletionService
from speculative_complete.lsp_server.config import SECTION, Layered, Settings, layer
from speculative_complete.lsp_server.documents import open_document
from speculative_complete.lsp_server.local.loading import import_decoding
from speculative_complete.lsp_server.model_host import ModelHost
from speculative_complete.lsp_server.protocol import CompletionProtocol, use_lsp_line_model
from speculative_complete.lsp_server.scheduler import Scheduler, StopHook
from speculative_complete.lsp_server.stats import ServerStats, distribution, process_memory
from speculative_complete.lsp_server.workspace import (
    WATCHED_GLOB,
    WorkspaceLimits,
    uri_paths,
    workspace_roots,
)

if TYPE_CHECKING:
    from speculative_complete.lsp_server.remote.health import Notice

log = logging.getLogger(__name__)

STATS_METHOD = "lsp_server/stats"
CONFIG_PULL_TIMEOUT_S = 5.0
LABEL_CHARS = 80


class CompletionServer(LanguageServer):
    """pygls' server plus the state the handlers share: settings, model, scheduler, stats."""

    def __init__(self, cli: Layered, wrap_request_stop: StopHook | None = None) -> None:
        """``wrap_request_stop``: for tests only (``Scheduler``'s)."""
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
        # freed activations go back to the OS between requests: glibc would keep them resident
        self.scheduler = Scheduler(on_idle=trim_heap, wrap_request_stop=wrap_request_stop)
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
        self.watching: asyncio.Future | None = None  # asking the client to watch the workspace's files
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
            if _workspace_budget(previous) != _workspace_budget(self.settings):
                self.scan_workspace()
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
        # A new model has a new drafter and maybe a new tokenizer: the workspace is indexed anew.
        self._load_task.add_done_callback(lambda _: self._stopped or self.service.idle.index_workspace())

    # -- the workspace as a draft source -----------------------------------------------------------
    def scan_workspace(self) -> None:
        """Read the workspace folders' source files on a thread, then index them when idle; not
        with a remote engine (it has no local drafter: nothing is read)."""
        limits = WorkspaceLimits(max_bytes=_workspace_budget(self.settings) << 20)
        roots = workspace_roots((f.uri for f in self.workspace.folders.values()), self.workspace.root_uri)
        scan = asyncio.to_thread(self.service.workspace.scan, roots, limits)
        self._track(asyncio.ensure_future(scan))

    def workspace_files_changed(self, uris: list[str]) -> None:
        if self.service.workspace.roots:
            self._track(
                asyncio.ensure_future(asyncio.to_thread(self.service.workspace.changed, uri_paths(uris)))
            )

    def _track(self, task: asyncio.Future) -> None:
        """When the file work is done, index what changed; a failure is logged, never raised."""

        def done(task: asyncio.Future) -> None:
            if task.cancelled() or self._stopped:
                return
            if task.exception() is not None:
                log.error("reading the workspace failed: %s", task.exception())
                return
            self.service.idle.index_workspace()

        task.add_done_callback(done)

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


def _workspace_budget(settings: Settings) -> int:
    """MB of the workspace to index: none for a remote engine or the transformers peer (no local
    n-gram drafter to index for)."""
    local = settings.endpoint is None and settings.decoder == "speculative"
    return settings.workspace_index_mb if local else 0


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


def create_server(cli: Layered, wrap_request_stop: StopHook | None = None) -> CompletionServer:
    """The server with its handlers; ``wrap_request_stop`` for tests only (``Scheduler``'s)."""
    server = CompletionServer(cli, wrap_request_stop)
    _session_features(server)
    _shutdown_features(server)
    _completion_features(server)
    _workspace_features(server)
    _stats_feature(server)
    return server


def _session_features(server: CompletionServer) -> None:
    """Initialization, settings and document close."""

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
        ls.scan_workspace()
        if _can_watch_files(ls):
            ls.watching = asyncio.ensure_future(_watch_files(ls))

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


def _stats_feature(server: CompletionServer) -> None:
    """The stats request: what the server has done and holds, for benchmarks and diagnostics."""

    @server.feature(STATS_METHOD)
    def stats(ls: CompletionServer, params: Any) -> dict[str, Any]:
        snapshot = ls.stats.snapshot()
        snapshot["prefetch"]["running"] = ls.service.idle.prefetching
        return {
            **snapshot,
            "model": ls.host.state.to_dict(),
            "settings": ls.settings.to_lsp(),
            "kv_cache": ls.host.cache_snapshot(),
            "endpoint": ls.host.endpoint_snapshot(),
            "draft_sources": ls.service.idle.sources.snapshot(),
            "workspace_index": ls.service.workspace.snapshot(),
            "queued_ms": distribution(list(ls.scheduler.waits_ms)),
            "process": process_memory(),
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


def _workspace_features(server: CompletionServer) -> None:
    """The workspace's files as a draft source and the prompt's definitions, kept current on saves,
    watched-file events and folder changes (``workspace.py``); edits go to the ring of recent edits."""

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CompletionServer, params: types.DidChangeTextDocumentParams) -> None:
        """After pygls has applied the change: where it was goes to the ring of recent edits."""
        line = edited_line(params.content_changes)
        if line is not None:
            ls.service.edited(params.text_document.uri, line)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: CompletionServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.workspace_files_changed([params.text_document.uri])

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: CompletionServer, params: types.DidChangeWatchedFilesParams) -> None:
        ls.workspace_files_changed([change.uri for change in params.changes])

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_workspace_folders(
        ls: CompletionServer, params: types.DidChangeWorkspaceFoldersParams
    ) -> None:
        ls.scan_workspace()  # pygls has updated the folders already


def _can_watch_files(ls: CompletionServer) -> bool:
    workspace = ls.client_capabilities.workspace if ls.client_capabilities else None
    watched = workspace.did_change_watched_files if workspace else None
    return bool(watched and watched.dynamic_registration)


async def _watch_files(ls: CompletionServer) -> None:
    """Ask the client to report created, changed and deleted source files (saves are told by
    ``didSave``; this covers a checkout, a generator, another editor)."""
    watcher = types.FileSystemWatcher(glob_pattern=WATCHED_GLOB)
    registration = types.Registration(
        id="lsp_server/workspace-files",
        method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
        register_options=types.DidChangeWatchedFilesRegistrationOptions(watchers=[watcher]),
    )
    try:
        await asyncio.wait_for(
            ls.client_register_capability_async(types.RegistrationParams(registrations=[registration])),
            CONFIG_PULL_TIMEOUT_S,
        )
    except Exception as exc:  # a refusal or no answer: saves still keep the index current
        log.warning("no file watching for the workspace index (%s)", exc or type(exc).__name__)


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


def edited_line(changes: list[Any]) -> int | None:
    """The line the last ranged change ends on (a whole-text change says nothing about where)."""
    for change in reversed(changes):
        if isinstance(change, types.TextDocumentContentChangePartial):
            return change.range.start.line + change.text.count("\n")
    return None
