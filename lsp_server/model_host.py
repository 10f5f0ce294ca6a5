"""The loaded model, its engine and drafter, and their lifecycle (background load, reload, failure).

Loading takes seconds to minutes (importing torch alone takes ~2 s, a first GGUF conversion
~30 s), so it runs on its own daemon thread and the server answers empty meanwhile. Decoding runs
only on the scheduler's worker thread, which is the one thread that ever touches the engine and
its drafter; a reload swaps the reference, and a decode already running finishes on the old one.
``decoding`` (and so torch) is imported on those threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from lsp_server.config import Settings
from lsp_server.context import Prompt, fit_tokens
from lsp_server.tokens import Tokens

log = logging.getLogger(__name__)

State = Literal["idle", "loading", "ready", "failed"]
REPORT_EVERY_S = 2.0


@dataclass
class Runtime:
    """What one successful load produced; used on the worker thread only."""

    engine: Any  # decoding.SpeculativeEngine
    drafter: Any  # decoding.drafters.Drafter | None
    drafter_name: str
    draft_model: Any  # decoding.LoadedModel | None
    tokens: Any = None  # lsp_server.tokens.Tokens: the target's tokenizer, for building prompts

    def drafter_for(self, name: str) -> Any:
        """The drafter named ``name``; built once and kept, because it learns across requests."""
        if name != self.drafter_name:
            from decoding.drafters import make_drafter

            self.drafter = make_drafter(name, draft_model=self.draft_model, cost=self.engine.cost)
            self.drafter_name = name
        return self.drafter

    def ngram_source(self) -> Any:
        """The n-gram drafter that takes other open documents as sources, if the drafter has one.

        Seam for feeding open documents (``set_source`` / ``remove_source``) and accepted
        completions (``add_accepted``) to the drafter; not wired yet. The drafter is not
        thread-safe: call it on the worker thread, e.g. as a job of the scheduler.
        """
        return getattr(self.drafter, "ngram", None) or (
            self.drafter if hasattr(self.drafter, "set_source") else None)


@dataclass
class ModelState:
    status: State = "idle"
    spec: str = ""
    source: str | None = None
    device: str | None = None
    dtype: str | None = None
    error: str | None = None
    load_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "loaded": self.status == "ready", "spec": self.spec,
                "source": self.source or self.spec, "device": self.device, "dtype": self.dtype,
                "error": self.error, "load_ms": self.load_ms}


_IMPORT_LOCK = threading.Lock()


def import_decoding() -> None:
    """Import ``decoding`` (torch, transformers: seconds) once, from one thread at a time.

    Two threads importing the same large package at once can see it half-initialized, so the
    early preload (``__main__``) and the loader both go through this lock.
    """
    with _IMPORT_LOCK:
        import decoding.drafters  # noqa: F401  (imports decoding too)


def load_runtime(settings: Settings) -> Runtime:
    """Load target (and draft) for ``settings``; raises with a message meant for the user."""
    import_decoding()
    from transformers.utils import logging as hf_logging

    from decoding import SpeculativeEngine, load_model
    from decoding.drafters import make_drafter
    from decoding.models import check_draft_compatible

    hf_logging.disable_progress_bar()  # its bars would only add noise to the server's stderr
    target = load_model(settings.model, device=settings.device, dtype=settings.dtype)
    draft = None
    if settings.draft_model:
        draft = load_model(settings.draft_model, device=settings.device, dtype=settings.dtype)
        check_draft_compatible(target, draft)
    engine = SpeculativeEngine(target)
    drafter = make_drafter(settings.drafter, draft_model=draft, cost=engine.cost)
    engine.healing_index  # noqa: B018  (token healing's table: built here, not on the first request)
    return Runtime(engine=engine, drafter=drafter, drafter_name=settings.drafter, draft_model=draft,
                   tokens=Tokens.for_engine(engine))


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """The message for the user, and whether the failure was an expected one (no traceback needed)."""
    try:
        from decoding import ModelLoadError
    except Exception:  # decoding itself failed to import: the exception says why
        ModelLoadError = ()
    if ModelLoadError and isinstance(exc, ModelLoadError):
        return str(exc), True
    if isinstance(exc, ValueError):  # e.g. make_drafter refusing a combination
        return str(exc), True
    return f"{type(exc).__name__}: {exc}", False


class ModelHost:
    """Owns at most one ``Runtime``; only the newest load may install its result."""

    def __init__(self, loader: Callable[[Settings], Runtime] = load_runtime) -> None:
        self._loader = loader
        self._runtime: Runtime | None = None
        self._generation = 0
        self.state = ModelState()

    @property
    def ready(self) -> bool:
        return self._runtime is not None

    async def load(self, settings: Settings,
                   report: Callable[[str], None] | None = None) -> ModelState | None:
        """Load ``settings``' model in a daemon thread; ``report`` gets a line every few seconds.

        Returns the final state, or None when a newer load started meanwhile (this one's result
        is dropped). The previous model is released first (a decode still running holds it until
        its next step), so a reload doesn't need room for two models.
        """
        self._generation += 1
        generation = self._generation
        self._runtime = None
        self.state = ModelState(status="loading", spec=settings.model)
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def work() -> None:
            try:
                outcome: tuple[Runtime | None, str | None] = (self._loader(settings), None)
            except BaseException as exc:  # a load may fail in any way; the server must stay up
                message, expected = describe_error(exc)
                log.error("model %s failed to load: %s", settings.model, message, exc_info=not expected)
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
                report(f"loading {settings.model}: {time.monotonic() - started:.0f} s")
        runtime, error = done.result()
        if generation != self._generation:
            log.info("discarding the load of %s: a newer load started", settings.model)
            return None
        load_ms = round((time.monotonic() - started) * 1000, 1)
        if runtime is None:
            self.state = ModelState(status="failed", spec=settings.model, error=error, load_ms=load_ms)
            return self.state
        target = runtime.engine.target
        self._runtime = runtime
        self.state = ModelState(status="ready", spec=settings.model, source=target.source,
                                device=str(target.device), dtype=str(target.dtype).removeprefix("torch."),
                                load_ms=load_ms)
        return self.state

    def tokens(self) -> Tokens | None:
        """The loaded model's tokenizer for building prompts (worker thread); None: no model."""
        runtime = self._runtime
        if runtime is None:
            return None
        if runtime.tokens is None:
            runtime.tokens = Tokens.for_engine(runtime.engine)
        return runtime.tokens

    def generate(self, prompt: Prompt, settings: Settings, stop_at_newline: bool,
                 should_stop: Callable[[], bool], stop_when: Callable[[str], int | None] | None = None,
                 tokens: Tokens | None = None) -> Any:
        """Decode on the worker thread; None when no model is loaded (it was unloaded meanwhile)
        or when ``prompt`` was tokenized with ``tokens`` of a model replaced since."""
        runtime = self._runtime
        if runtime is None or (tokens is not None and tokens is not runtime.tokens):
            return None
        from decoding import GenerationConfig

        engine = runtime.engine
        if prompt.ids is not None:
            ids = list(prompt.ids)
        else:
            ids = fit_tokens(prompt.text, engine.encode, settings.context_tokens)
        config = GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_at_newline=stop_at_newline,
                                  required_prefix=prompt.healed, stop_strings=prompt.stop_strings,
                                  stop_when=stop_when)
        return engine.generate(ids, config, runtime.drafter_for(settings.drafter), cancel=should_stop)
