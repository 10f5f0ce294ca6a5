"""The real models of ``benchmarks/real_models.py`` for tests: found where installed, or the test
skipped with the command that installs them."""

from __future__ import annotations

import pytest


def installed_real_model(name: str):
    """A real model's GGUF (``benchmarks/real_models.py``), or the test skipped saying how to
    install it (``.ci/run`` installs every one)."""
    from benchmarks import real_models

    found = real_models.installed_path(name)
    if found is None:
        pytest.skip(f"{name} is not installed here: python -m benchmarks.real_models --install {name}")
    return found
