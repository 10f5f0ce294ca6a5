"""Speculative decoding for code completion: models, drafters, acceptance rules and the loop.

This package knows nothing about LSP or asyncio; the server drives it from a worker thread.

Its names are imported lazily (PEP 562): ``speculative_complete.decoding.engine.healing`` and
``speculative_complete.decoding.results`` are pure Python, and a server that decodes on a remote
engine uses them without importing torch, which ``engine`` and ``models`` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
    from speculative_complete.decoding.models.loading import LoadedModel, ModelLoadError, load_model
    from speculative_complete.decoding.results import GenerationResult, GenerationStats

_WHERE = {
    "GenerationConfig": "speculative_complete.decoding.engine.loop",
    "SpeculativeEngine": "speculative_complete.decoding.engine.loop",
    "GenerationResult": "speculative_complete.decoding.results",
    "GenerationStats": "speculative_complete.decoding.results",
    "LoadedModel": "speculative_complete.decoding.models.loading",
    "ModelLoadError": "speculative_complete.decoding.models.loading",
    "load_model": "speculative_complete.decoding.models.loading",
}

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "ModelLoadError",
    "SpeculativeEngine",
    "load_model",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
