"""Shared fixtures: the embedded default model, loaded once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def default_model():
    from decoding.models import load_model

    return load_model("default", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def default_tokenizer_folder(tmp_path_factory, default_model):
    folder = tmp_path_factory.mktemp("default-tokenizer")
    default_model.tokenizer.save_pretrained(folder)
    return folder
