"""Speculative decoding for code completion: models, drafters, acceptance rules and the loop.

This package knows nothing about LSP or asyncio; the server drives it from a worker thread.
"""

from decoding.engine import GenerationConfig, GenerationResult, GenerationStats, SpeculativeEngine
from decoding.models import LoadedModel, ModelLoadError, load_model

__all__ = [
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "LoadedModel",
    "ModelLoadError",
    "SpeculativeEngine",
    "load_model",
]
