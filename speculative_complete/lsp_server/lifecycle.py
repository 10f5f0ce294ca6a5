"""Model (re)loads as the user sees them: work-done progress, a log line, an error message.

The client sees ``$/progress`` begin, at least one report, and end (with the token created first
through ``window/workDoneProgress/create`` when the client supports it; without that support
there is no progress, only log messages). A failed load is a ``window/showMessage`` error with
the reason; the server stays up and answers empty until a load succeeds.

Editors ask for inline completions only when the user types, so the end of a progress whose token
starts with ``LOAD_PROGRESS`` is what makes both editor clients ask again where the cursor is
(LSP has no refresh request for inline completions).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.model_host import ModelHost

log = logging.getLogger(__name__)
CREATE_TIMEOUT_S = 5.0
LOAD_PROGRESS = "lsp_server/load/"  # the editors ask again when a progress under it ends


def _supports_progress(ls: LanguageServer) -> bool:
    window = ls.client_capabilities.window if ls.client_capabilities else None
    return bool(window and window.work_done_progress)


async def _create_token(ls: LanguageServer) -> str | None:
    if not _supports_progress(ls):
        return None
    token = f"{LOAD_PROGRESS}{uuid.uuid4().hex[:12]}"
    try:
        await asyncio.wait_for(ls.work_done_progress.create_async(token), CREATE_TIMEOUT_S)
    except Exception as exc:  # a refusal or no answer: go on, without a progress bar
        log.warning("no work-done progress for the model load (%s)", exc or type(exc).__name__)
        return None
    return token


async def load_model(ls: LanguageServer, host: ModelHost, settings: Settings) -> None:
    """Load ``settings``' model in the background and tell the user how it went."""
    describe = _describe(settings)
    token = await _create_token(ls)
    progress = ls.work_done_progress
    if token is not None:
        progress.begin(
            token,
            types.WorkDoneProgressBegin(
                title="lsp_server",
                message=f"loading {settings.endpoint or settings.model}",
                cancellable=False,
            ),
        )
    log.info("loading %s", describe)
    ls.window_log_message(
        types.LogMessageParams(type=types.MessageType.Info, message=f"lsp_server: loading {describe}")
    )

    def report(message: str) -> None:
        if token is not None:
            progress.report(token, types.WorkDoneProgressReport(message=message))

    report(f"loading {settings.model}: reading weights" if settings.endpoint is None else "connecting")
    state = await host.load(settings, report)
    if state is None:  # a newer load (settings changed again) took over
        if token is not None:
            progress.end(token, types.WorkDoneProgressEnd(message="superseded by a newer load"))
        return
    if state.status == "ready":
        message = (
            f"lsp_server: model {state.source} loaded on {state.device} ({state.dtype}) "
            f"in {state.load_ms / 1000:.1f} s"
            if state.engine == "local"
            else f"lsp_server: decoding on the remote engine {state.source}"
        )
        log.info("%s", message)
        if token is not None:
            progress.end(token, types.WorkDoneProgressEnd(message=message.removeprefix("lsp_server: ")))
        ls.window_log_message(types.LogMessageParams(type=types.MessageType.Info, message=message))
        return
    message = (
        f"lsp_server: could not load model {settings.model!r}: {state.error}. "
        "Completions stay off until a model loads; change the 'model' setting."
        if settings.endpoint is None
        else f"lsp_server: could not use the endpoint {settings.endpoint!r}: {state.error}. "
        "Completions stay off until it can be used; change the 'endpoint' settings."
    )
    if token is not None:
        progress.end(token, types.WorkDoneProgressEnd(message=f"failed: {state.error}"))
    ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))
    ls.window_log_message(types.LogMessageParams(type=types.MessageType.Error, message=message))


def _describe(settings: Settings) -> str:
    if settings.endpoint is not None:
        return f"the remote engine {settings.endpoint} ({settings.endpoint_api})"
    return f"model {settings.model} (device {settings.device}, dtype {settings.dtype}" + (
        f", draft {settings.draft_model})" if settings.draft_model else ")"
    )
