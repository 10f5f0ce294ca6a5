"""Loading the local engine: the target (and draft) models, then the engine and drafter over them.

Runs on the host's loader thread (``model_host.ModelHost.load``): loading takes seconds to minutes
and ``decoding`` (torch, transformers) is imported here, inside the functions, never on the event
loop. ``kvCacheMb`` is split between the target's and a draft model's per-document KV caches in
proportion to what a token costs each (``kv_share``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import Tokens
from speculative_complete.lsp_server.local.local_runtime import MB, LocalRuntime

if TYPE_CHECKING:  # decoding imports torch: only on the loader and worker threads
    from speculative_complete.decoding import LoadedModel

_IMPORT_LOCK = threading.Lock()


def import_decoding() -> None:
    """Import ``decoding`` (torch, transformers: seconds) once, from one thread at a time.

    Two threads importing the same large package at once can see it half-initialized, so the
    early preload (``__main__``) and the loader both go through this lock.
    """
    with _IMPORT_LOCK:
        import speculative_complete.decoding.drafters  # noqa: F401  (imports decoding too)


def load_runtime(settings: Settings) -> LocalRuntime:
    """Load target (and draft) for ``settings``; raises with a message meant for the user."""
    import_decoding()
    from speculative_complete.decoding import load_model
    from speculative_complete.decoding.memory import give_back_freed_memory
    from speculative_complete.decoding.models.loading import check_draft_compatible

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
            draft=True,
        )
        check_draft_compatible(target, draft)
    runtime = assemble_runtime(settings, target, draft)
    give_back_freed_memory()
    return runtime


def assemble_runtime(settings: Settings, target: LoadedModel, draft: LoadedModel | None) -> LocalRuntime:
    """The engine and drafter over loaded models, with ``kvCacheMb`` split between the target's
    and the draft model's per-document KV caches (``kv_share``)."""
    from speculative_complete.decoding import SpeculativeEngine
    from speculative_complete.decoding.drafters import load_head_drafter, make_drafter
    from speculative_complete.decoding.kv_cache import PrefixCache

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
    return LocalRuntime(
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
