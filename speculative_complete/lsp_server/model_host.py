"""The loaded runtime and its lifecycle (background load, reload, failure), and what it reports.

Loading takes seconds to minutes (importing torch alone takes seconds), so it runs on its own
daemon thread and the server answers empty meanwhile. Decoding runs only on the scheduler's worker
thread, which is the one thread that ever touches the engine and its drafter; a reload swaps the
reference, and a decode already running finishes on the old one.
``decoding`` (and so torch) is imported on those threads, never on the event loop.

The host only loads, closes and reports (the model's state, the KV-cache and endpoint stats) and
forgets a closed document's caches; what it holds is an ``EngineRuntime``
(``runtime_interface.py``): the local engine (``local/``: ``LocalRuntime``, which keeps each
document's KV cache and greedy chain across requests) or, with ``endpoint`` set, a
``RemoteRuntime`` (``remote/``), built on the same loader thread without importing torch. What the
worker does between requests (draft sources, decoding ahead, the workspace index) is ``idle.py``'s,
through the runtime's interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.local.loading import load_runtime
from speculative_complete.lsp_server.local.local_runtime import LocalRuntime, renewal_key
from speculative_complete.lsp_server.runtime_interface import EngineRuntime

if TYPE_CHECKING:
    from speculative_complete.lsp_server.remote.health import Notice
    from speculative_complete.lsp_server.remote.remote_runtime import RemoteRuntime

log = logging.getLogger(__name__)

State = Literal["idle", "loading", "ready", "failed"]
REPORT_EVERY_S = 2.0


@dataclass
class ModelState:
    status: State = "idle"
    spec: str = ""
    source: str | None = None
    device: str | None = None
    dtype: str | None = None
    quantization: str | None = None  # "none", or the weights' formats (a GGUF's block types, int4, int8)
    draft_head: str | None = None  # the draft head's folder, if one was loaded
    error: str | None = None
    load_ms: float | None = None
    engine: str = "local"  # "remote": decoded by the inference server at ``source``

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "engine": self.engine,
            "loaded": self.status == "ready",
            "spec": self.spec,
            "source": self.source or self.spec,
            "device": self.device,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "draft_head": self.draft_head,
            "error": self.error,
            "load_ms": self.load_ms,
        }


def load_engine_runtime(
    settings: Settings, on_notice: Callable[[Notice], None] | None = None
) -> EngineRuntime:
    """The runtime ``settings`` ask for: the remote engine at ``endpoint`` (no torch), else the
    local model; raises with a message meant for the user."""
    if settings.endpoint is not None:
        from speculative_complete.lsp_server.remote.remote_runtime import RemoteRuntime

        return RemoteRuntime.connect(settings, on_notice)
    return load_runtime(settings)


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """The message for the user, and whether the failure was an expected one (no traceback needed)."""
    # Only a local load imports speculative_complete.decoding.models.loading (torch); a remote one
    # must not import it to ask.
    models = sys.modules.get("speculative_complete.decoding.models.loading")
    load_error = getattr(models, "ModelLoadError", None)
    if load_error is not None and isinstance(exc, load_error):
        return str(exc), True
    if isinstance(exc, ValueError):  # e.g. make_drafter refusing a combination
        return str(exc), True
    return f"{type(exc).__name__}: {exc}", False


def _engine_kind(settings: Settings) -> str:
    return "remote" if settings.endpoint is not None else "local"


def _close_quietly(runtime: EngineRuntime) -> None:
    try:
        runtime.close()
    except Exception:  # closing must never take the server down
        log.exception("closing the previous runtime failed")


def _ready_state(runtime: EngineRuntime, spec: str, load_ms: float) -> ModelState:
    if isinstance(runtime, LocalRuntime):
        target = runtime.engine.target
        return ModelState(
            status="ready",
            spec=spec,
            source=target.source,
            device=str(target.device),
            dtype=str(target.dtype).removeprefix("torch."),
            quantization=target.quantization,
            draft_head=runtime.draft_head.folder if runtime.draft_head is not None else None,
            load_ms=load_ms,
        )
    remote: RemoteRuntime = runtime  # type: ignore[assignment]
    config = remote.engine.config
    return ModelState(
        status="ready",
        spec=spec,
        source=f"{config.url.text} ({config.api}" + (f", model {config.model})" if config.model else ")"),
        device="remote",
        load_ms=load_ms,
        engine="remote",
    )


class ModelHost:
    """Owns at most one runtime; only the newest load may install its result."""

    def __init__(
        self, loader: Callable[[Settings, Callable[[Notice], None] | None], EngineRuntime] | None = None
    ) -> None:
        self._loader = loader or load_engine_runtime
        self._runtime: EngineRuntime | None = None
        self._generation = 0
        self.state = ModelState()
        # A remote engine's outage and recovery notices; called on whatever thread noticed.
        self.on_notice: Callable[[Notice], None] | None = None

    @property
    def ready(self) -> bool:
        return self._runtime is not None

    @property
    def runtime(self) -> EngineRuntime | None:
        """The runtime to decode with (None while none is loaded); hold on to it for a request."""
        return self._runtime

    @property
    def local(self) -> LocalRuntime | None:
        """The runtime when it is the local engine (the KV caches are its only)."""
        runtime = self._runtime
        return runtime if isinstance(runtime, LocalRuntime) else None

    async def load(
        self, settings: Settings, report: Callable[[str], None] | None = None
    ) -> ModelState | None:
        """Load ``settings``' model (or connect its endpoint) in a daemon thread; ``report`` gets a
        line every few seconds.

        Returns the final state, or None when a newer load started meanwhile (this one's result
        is dropped). The previous runtime is released first, on the loader thread (a decode still
        running holds it until its next step; a remote one's stream is closed), so a reload
        doesn't need room for two models.
        """
        self._generation += 1
        generation = self._generation
        previous, self._runtime = self._runtime, None
        spec = settings.endpoint or settings.model
        self.state = ModelState(status="loading", spec=spec, engine=_engine_kind(settings))
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def work() -> None:
            if previous is not None:
                _close_quietly(previous)
            try:
                built = self._loader(settings, self._notice)
                outcome: tuple[EngineRuntime | None, str | None] = (built, None)
            except BaseException as exc:  # a load may fail in any way; the server must stay up
                message, expected = describe_error(exc)
                log.error("model %s failed to load: %s", spec, message, exc_info=not expected)
                outcome = (None, message)
            with contextlib.suppress(RuntimeError):  # the loop is gone: the server exited while loading
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(outcome))

        started = time.monotonic()
        threading.Thread(target=work, name="model-loader", daemon=True).start()
        while True:
            finished, _ = await asyncio.wait([done], timeout=REPORT_EVERY_S)
            if finished:
                break
            if report is not None and generation == self._generation:
                report(f"loading {spec}: {time.monotonic() - started:.0f} s")
        runtime, error = done.result()
        if generation != self._generation:
            log.info("discarding the load of %s: a newer load started", spec)
            if runtime is not None:
                threading.Thread(target=_close_quietly, args=(runtime,), daemon=True).start()
            return None
        load_ms = round((time.monotonic() - started) * 1000, 1)
        if runtime is None:
            self.state = ModelState(
                status="failed", spec=spec, error=error, load_ms=load_ms, engine=_engine_kind(settings)
            )
            return self.state
        self._runtime = runtime
        self.state = _ready_state(runtime, spec, load_ms)
        return self.state

    def _notice(self, notice: Notice) -> None:
        listener = self.on_notice
        if listener is not None:
            listener(notice)

    def close(self) -> None:
        """The server is stopping: release the runtime (a remote one's connections)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            _close_quietly(runtime)

    def cache_snapshot(self) -> dict[str, Any] | None:
        runtime = self.local
        return runtime.engine.prefix_cache.snapshot() if runtime is not None else None

    def endpoint_snapshot(self) -> dict[str, Any] | None:
        """The remote engine's ``endpoint`` block of the stats; None for the local engine."""
        runtime = self._runtime
        return runtime.snapshot() if runtime is not None and runtime.kind == "remote" else None

    def forget(self, uri: str) -> None:
        """The document was closed: drop its KV caches, even one a decode holds right now."""
        runtime = self.local
        if runtime is not None:
            runtime.engine.prefix_cache.drop(uri)
            runtime.engine.prefix_cache.drop(renewal_key(uri))

    def forget_on_worker(self, uri: str) -> None:
        """The document was closed: the drafter's state for it (worker thread)."""
        runtime = self._runtime
        if runtime is not None:
            runtime.forget(uri)
