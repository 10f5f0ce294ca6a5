"""Speculative decoding for code completion: models, drafters, acceptance rules and the loop.

This package knows nothing about LSP or asyncio; the server drives it from a worker thread.

Its names are imported lazily (PEP 562): ``decoding.engine.healing`` and ``decoding.results`` are pure
Python, and a server that decodes on a remote engine uses them without importing torch, which
``engine`` and ``models`` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoding.engine.loop import GenerationConfig, SpeculativeEngine
    from decoding.models.loading import LoadedModel, ModelLoadError, load_model
    from decoding.results import GenerationResult, GenerationStats

_WHERE = {
    "GenerationConfig": "decoding.engine.loop",
    "SpeculativeEngine": "decoding.engine.loop",
    "GenerationResult": "decoding.results",
    "GenerationStats": "decoding.results",
    "LoadedModel": "decoding.models.loading",
    "ModelLoadError": "decoding.models.loading",
    "load_model": "decoding.models.loading",
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
