"""Shared fixtures: the embedded default model, loaded once per test session."""

from __future__ import annotations

import os

import pytest

from tests.support.real_models import installed_real_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def default_model():
    """What the server loads by default: the GGUF's own quantized blocks on the lean forward."""
    from speculative_complete.decoding.models.loading import load_model

    return load_model("default", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def fp32_model():
    """The same GGUF dequantized to fp32 on transformers' forward (``quantization: none``)."""
    from speculative_complete.decoding.models.loading import load_model

    return load_model("default", device="cpu", dtype="float32", quantization="none")


@pytest.fixture(scope="session")
def default_tokenizer_folder(tmp_path_factory, default_model):
    folder = tmp_path_factory.mktemp("default-tokenizer")
    default_model.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(params=["native", "torch"])
def kernel_backend(request, monkeypatch):
    """Run a test on llama.cpp's kernels (``LSP_NATIVE=1``, the default where built) and on
    torch's (``LSP_NATIVE=0``, the fallback); forwards made inside the test take the backend."""
    from speculative_complete.decoding.forward.native.serving import kernels

    monkeypatch.setenv("LSP_NATIVE", "1" if request.param == "native" else "0")
    kernels.cache_clear()
    if request.param == "native" and kernels() is None:
        pytest.skip("the native kernels are not built")
    kernels.cache_clear()
    yield request.param
    monkeypatch.undo()
    kernels.cache_clear()


@pytest.fixture(scope="session")
def real_target():
    """The real Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) as the server loads it."""
    from benchmarks.real_models import TARGET
    from speculative_complete.decoding.models.loading import load_model

    return load_model(str(installed_real_model(TARGET)), device="cpu")


@pytest.fixture(scope="session")
def real_small():
    """The real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M) loaded as a target, as the server loads its
    ``model``."""
    from benchmarks.real_models import DRAFT
    from speculative_complete.decoding.models.loading import load_model

    return load_model(str(installed_real_model(DRAFT)), device="cpu")


@pytest.fixture(scope="session")
def real_draft():
    """The real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M): the 1.5B's draft model, one vocabulary."""
    from benchmarks.real_models import DRAFT
    from speculative_complete.decoding.models.loading import load_model

    return load_model(str(installed_real_model(DRAFT)), device="cpu", draft=True)
