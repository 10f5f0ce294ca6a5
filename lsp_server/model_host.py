"""The loaded model, its engine and drafter, and their lifecycle (background load, reload, failure).

Loading takes seconds to minutes (importing torch alone takes seconds), so it runs on its own
daemon thread and the server answers empty meanwhile. Decoding runs only on the scheduler's worker
thread, which is the one thread that ever touches the engine and its drafter; a reload swaps the
reference, and a decode already running finishes on the old one.
``decoding`` (and so torch) is imported on those threads, never on the event loop.

Across requests the runtime keeps each document's KV cache and greedy chain (``PrefixCache``,
keyed by the document's URI, which also records the document's latest request) and the n-gram
drafter's extra sources (``DraftSources``); when the worker is idle, ``background`` indexes
changed documents and decodes ahead (prefetch).

With ``endpoint`` set the host holds a ``RemoteRuntime`` (``lsp_server/remote``) instead: built on
the same loader thread, without importing torch; both are ``EngineRuntime``s (``runtime.py``).
Idle-time work and the KV-cache stats are the local engine's only.
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
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from lsp_server.config import Settings
from lsp_server.context import ContextBuilder, ContextRequest, Prompt, Tokens
from lsp_server.ending import Ending
from lsp_server.runtime import EngineRuntime
from lsp_server.sources import DocumentSnapshot, DraftSources

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from decoding import GenerationConfig, GenerationResult, LoadedModel, SpeculativeEngine
    from decoding.drafters import Drafter, HeadDrafter
    from decoding.drafters.base import DocumentSources
    from decoding.kv_cache import Chain, PrefixCache
    from decoding.transformers_peer import TransformersDecoder
    from lsp_server.remote.health import Notice
    from lsp_server.remote.runtime import RemoteRuntime

log = logging.getLogger(__name__)

State = Literal["idle", "loading", "ready", "failed"]
REPORT_EVERY_S = 2.0
MB = 1 << 20
PREFETCH_LINES = 2  # the chain may run this many line ends past the prompt before prefetch stops


@dataclass
class Runtime:
    """What one successful load produced: an engine that decodes a prompt into a suggestion.
    Used on the worker thread only; a request holds on to one runtime from its prompt to its
    answer, so the ids it is fed always come from the tokenizer of the model that decodes them."""

    engine: SpeculativeEngine  # with its PrefixCache: per document, the KV cache and greedy chain
    drafter: Drafter | None
    drafter_name: str
    draft_model: LoadedModel | None
    draft_head: HeadDrafter | None
    tokens: Tokens  # the target's tokenizer, for building prompts
    kv_cache_bytes: int = 0  # ``kvCacheMb`` as last applied: both models' KV caches together
    draft_kv_share: float = 0.0  # of that, the draft model's per-document caches' (``kv_share``)
    _peer: TransformersDecoder | None = None  # built on first use
    kind: ClassVar[str] = "local"

    def prompt(self, builder: ContextBuilder, request: ContextRequest, deadline: float | None) -> Prompt:
        """Exact and instant: the engine's own tokenizer (the deadline is the decode's business)."""
        return builder.build(request, self.tokens)

    def generate(
        self,
        prompt: Prompt,
        settings: Settings,
        ending: Ending,
        should_stop: Callable[[], bool],
        cache_key: str | None = None,
        deadline: float | None = None,
        answer_by: float | None = None,
    ) -> GenerationResult:
        """Decode after ``prompt`` until ``ending`` says the suggestion is over; ``cache_key`` (the
        document) selects the KV cache and greedy chain to reuse and keep. A multi-line body is
        answered with its whole lines from ``answer_by`` on, where the chain keeps the rest."""
        from decoding import GenerationConfig

        engine = self.engine
        self.fit_caches(settings.kv_cache_mb * MB)
        config = GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            stop_at_newline=ending.stop_at_newline,
            reuse_continuation=settings.type_ahead,
            required_prefix=prompt.healed,
            stop_strings=prompt.stop_strings,
            stop_when=ending.cut if ending.multiline else None,
            answer_due=_due_at(answer_by) if ending.multiline and keeps_chains(settings, cache_key) else None,
        )
        ids = list(prompt.ids)
        if settings.decoder == "transformers":
            return self.peer().generate(ids, config, settings.drafter, cancel=should_stop)
        return engine.generate(
            ids,
            config,
            self.drafter_for(settings.drafter),
            cancel=should_stop,
            cache_key=cache_key if settings.kv_cache_mb > 0 else None,
        )

    @property
    def draft_cache_bytes(self) -> int:
        """The draft model's per-document KV caches' part of ``kv_cache_bytes``."""
        return int(self.kv_cache_bytes * self.draft_kv_share)

    def fit_caches(self, total_bytes: int) -> None:
        """Bound both models' per-document KV caches by ``total_bytes`` together (``kvCacheMb``,
        which may change between requests): the draft model's take their share, the target's
        the rest, and each evicts down to its part at once (worker thread)."""
        self.kv_cache_bytes = max(0, int(total_bytes))
        self.engine.prefix_cache.resize(self.kv_cache_bytes - self.draft_cache_bytes)
        sessions = self._draft_sessions()
        if sessions is not None:
            sessions.resize(self.draft_cache_bytes)

    def _draft_sessions(self) -> PrefixCache | None:
        """The draft model's per-document caches, if the drafter has a draft model (alone or in
        ``auto``)."""
        from decoding.drafters import AutoDrafter, ModelDrafter

        drafter = self.drafter
        model = drafter.model if isinstance(drafter, AutoDrafter) else drafter
        return model.sessions if isinstance(model, ModelDrafter) else None

    def forget(self, uri: str) -> None:
        """``uri`` was closed: the drafter drops its sources and caches for it (worker thread)."""
        if self.drafter is not None:
            self.drafter.forget(uri)

    def close(self) -> None:
        """Nothing to release by hand: the weights go with the last reference."""

    def snapshot(self) -> dict[str, Any] | None:
        return None

    def drafter_for(self, name: str) -> Drafter | None:
        """The drafter named ``name``; built once and kept, because it learns across requests."""
        if name != self.drafter_name:
            from decoding.drafters import make_drafter

            build = name
            if name == "head" and self.draft_head is None:
                log.warning("drafter 'head': no draft head for this model (draftHead); using auto")
                build = "auto"
            self.drafter = make_drafter(
                build,
                draft_model=self.draft_model,
                draft_head=self.draft_head,
                cost=self.engine.cost,
                session_cache_bytes=self.draft_cache_bytes,
                target_vocab=self.engine.target.vocab_size,
            )
            self.drafter_name = name
        return self.drafter

    def ngram_source(self) -> DocumentSources | None:
        """The n-gram drafter that takes other open documents as sources, if the drafter has one.
        Not thread-safe: call it on the worker thread only."""
        return self.drafter.document_sources() if self.drafter is not None else None

    def peer(self) -> TransformersDecoder:
        if self._peer is None:
            from decoding.transformers_peer import TransformersDecoder

            self._peer = TransformersDecoder(self.engine, self.draft_model)
        return self._peer


def keeps_chains(settings: Settings, cache_key: str | None) -> bool:
    """Whether a document's greedy chain is kept and answers the next request from it: what an
    early answer relies on to hand the rest of a block to the next request."""
    return (
        cache_key is not None
        and settings.kv_cache_mb > 0
        and settings.type_ahead
        and settings.decoder == "speculative"
    )


def _due_at(answer_by: float | None) -> Callable[[], bool] | None:
    """The engine's ``answer_due`` check for a first answer due at ``answer_by``."""
    if answer_by is None:
        return None
    return lambda: time.monotonic() >= answer_by


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


_IMPORT_LOCK = threading.Lock()


def import_decoding() -> None:
    """Import ``decoding`` (torch, transformers: seconds) once, from one thread at a time.

    Two threads importing the same large package at once can see it half-initialized, so the
    early preload (``__main__``) and the loader both go through this lock.
    """
    with _IMPORT_LOCK:
        import decoding.drafters  # noqa: F401  (imports decoding too)


def load_engine_runtime(
    settings: Settings, on_notice: Callable[[Notice], None] | None = None
) -> EngineRuntime:
    """The runtime ``settings`` ask for: the remote engine at ``endpoint`` (no torch), else the
    local model; raises with a message meant for the user."""
    if settings.endpoint is not None:
        from lsp_server.remote.runtime import RemoteRuntime

        return RemoteRuntime.connect(settings, on_notice)
    return load_runtime(settings)


def load_runtime(settings: Settings) -> Runtime:
    """Load target (and draft) for ``settings``; raises with a message meant for the user."""
    import_decoding()
    from decoding import load_model
    from decoding.models import check_draft_compatible, give_back_freed_memory

    target = load_model(
        settings.model, device=settings.device, dtype=settings.dtype, quantization=settings.quantization
    )
    draft = None
    if settings.draft_model:
        draft = load_model(
            settings.draft_model,
            device=settings.device,
            dtype=settings.dtype,
            quantization=settings.quantization,
        )
        check_draft_compatible(target, draft)
    runtime = assemble_runtime(settings, target, draft)
    give_back_freed_memory()
    return runtime


def assemble_runtime(settings: Settings, target: LoadedModel, draft: LoadedModel | None) -> Runtime:
    """The engine and drafter over loaded models, with ``kvCacheMb`` split between the target's
    and the draft model's per-document KV caches (``kv_share``)."""
    from decoding import SpeculativeEngine
    from decoding.drafters import load_head_drafter, make_drafter
    from decoding.kv_cache import PrefixCache

    share = kv_share(target, draft)
    total = settings.kv_cache_mb * MB
    draft_bytes = int(total * share)
    engine = SpeculativeEngine(target, prefix_cache=PrefixCache(total - draft_bytes))
    head = load_head_drafter(target, settings.draft_head, cost=engine.cost)
    drafter = make_drafter(
        settings.drafter if settings.drafter != "head" or head is not None else "auto",
        draft_model=draft,
        draft_head=head,
        cost=engine.cost,
        session_cache_bytes=draft_bytes,
        target_vocab=target.vocab_size,
    )
    engine.healing_index  # noqa: B018  (token healing's table: built here, not on the first request)
    return Runtime(
        engine=engine,
        drafter=drafter,
        drafter_name=settings.drafter,
        draft_model=draft,
        draft_head=head,
        tokens=Tokens.for_engine(engine),
        kv_cache_bytes=total,
        draft_kv_share=share,
    )


def kv_bytes_per_token(model: LoadedModel) -> int | None:
    """Keys and values one token costs ``model``'s cache, from its config (None: unknown)."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // heads if heads and getattr(config, "hidden_size", None) else None
    )
    if not (layers and kv_heads and head_dim):
        return None
    return int(layers * kv_heads * head_dim * 2 * model.dtype.itemsize)


def kv_share(target: LoadedModel, draft: LoadedModel | None) -> float:
    """The draft model's share of ``kvCacheMb``: its bytes per token over both models' together.

    Both caches are kept per document and serve the same prompts, so a split in proportion to what
    a token costs each lets both keep about the same documents; a draft cache evicted while the
    target's is kept would make the draft re-feed the whole prompt. Half each where a config does
    not say. An estimate only decides the split: each cache counts its real bytes against its part.
    """
    if draft is None:
        return 0.0
    t, d = kv_bytes_per_token(target), kv_bytes_per_token(draft)
    return d / (t + d) if t and d else 0.5


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """The message for the user, and whether the failure was an expected one (no traceback needed)."""
    # Only a local load imports decoding.models (torch); a remote one must not import it to ask.
    models = sys.modules.get("decoding.models")
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
    if isinstance(runtime, Runtime):
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
        self.sources = DraftSources()
        self.prefetching = False  # a decode ahead is running on the worker (shown in the stats)
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
    def local(self) -> Runtime | None:
        """The runtime when it is the local engine (idle-time work and KV caches are its only)."""
        runtime = self._runtime
        return runtime if isinstance(runtime, Runtime) else None

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
        """The document was closed: drop its KV cache, even one a decode holds right now."""
        runtime = self.local
        if runtime is not None:
            runtime.engine.prefix_cache.drop(uri)

    def forget_on_worker(self, uri: str) -> None:
        """The document was closed: its draft sources and the drafter's state for it (worker thread)."""
        runtime = self._runtime
        self.sources.forget(uri)
        if runtime is not None:
            runtime.forget(uri)

    @staticmethod
    def _asked_at(chain: Chain) -> tuple[int, str]:
        """Where the user's text ends on the chain: the last prompt's length and its healed text
        (which may itself hold a line end: a line start is healed)."""
        if chain.asked is not None and chain.asked.prompt_tokens <= len(chain.tokens):
            return chain.asked.prompt_tokens, chain.asked.owed
        return chain.greedy_from or len(chain.tokens), ""

    def _past_asked(self, engine: SpeculativeEngine, chain: Chain) -> str:
        """The text the greedy chain holds past what the user has typed."""
        asked, owed = self._asked_at(chain)
        return engine.decode(chain.tokens[asked:]).removeprefix(owed)

    def background(
        self,
        settings: Settings,
        documents: dict[str, DocumentSnapshot],
        uri: str | None,
        should_stop: Callable[[], bool],
        rest: Ending | None = None,
    ) -> GenerationResult | None:
        """Idle-time work on the worker: index changed documents as draft sources, then decode
        ahead on ``uri``'s greedy chain: the rest of a block answered early (``rest``: its
        ending), else the line after the suggestion, so that accepting it and moving on is
        answered at once. Returns what was decoded ahead, or None when nothing was."""
        runtime = self.local
        if runtime is None or settings.decoder != "speculative":
            return None
        engine = runtime.engine
        drafter = runtime.drafter_for(settings.drafter)
        self.sources.sync(runtime.ngram_source(), documents, uri, engine.encode, should_stop)
        if uri is None or not keeps_chains(settings, uri) or should_stop():
            return None
        chain = engine.prefix_cache.chain(uri)
        if chain is None or chain.greedy_from is None:
            return None
        from decoding import GenerationConfig

        if rest is not None:
            config = self._rest_of_block(engine, chain, rest, settings.max_new_tokens)
        elif settings.prefetch and self._past_asked(engine, chain).count("\n") < PREFETCH_LINES:
            config = GenerationConfig(
                max_new_tokens=settings.max_new_tokens, stop_at_newline=True, ahead=True
            )
        else:
            return None  # not wanted, or already decoded ahead
        if config is None:
            return None  # the chain already reaches the block's end
        self.prefetching = True
        try:
            return engine.generate(chain.tokens, config, drafter, cancel=should_stop, cache_key=uri)
        finally:
            self.prefetching = False

    def _rest_of_block(
        self, engine: SpeculativeEngine, chain: Chain, ending: Ending, max_new_tokens: int
    ) -> GenerationConfig | None:
        """How to decode on from where the chain ends to where a block answered early ends,
        within the tokens the request itself could have decoded; None when the chain already
        reaches the block's end (or the token limit)."""
        from decoding import GenerationConfig

        so_far = self._past_asked(engine, chain)
        asked, _ = self._asked_at(chain)
        remaining = max_new_tokens - (len(chain.tokens) - asked)
        if remaining <= 0 or ending.cut(so_far) is not None:
            return None

        def block_end(text: str) -> int | None:
            cut = ending.cut(so_far + text)
            return None if cut is None else max(0, cut - len(so_far))

        return GenerationConfig(max_new_tokens=remaining, stop_when=block_end, ahead=True)
