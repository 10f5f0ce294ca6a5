"""``docs/adding-a-model-architecture.md`` stays true: its steps, run as written on a tiny made-up
family (ToyCoder: Llama's layout under its own name, its GGUF's q and k rows in rotate-half order),
put the family on the lean forward. The row the page adds is taken into the architecture table for
the test only; the file is listed as fast, loads through the GGUF loader, and computes and decodes
greedily what transformers does on the same weights."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from speculative_complete.decoding.forward import architectures
from speculative_complete.decoding.forward.architectures import (
    Architecture,
    gguf_architecture,
    transformers_architecture,
)
from speculative_complete.decoding.forward.shapes import UnsupportedModel
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from speculative_complete.decoding.models.discovery import gguf_facts
from tests.support.ggufs import write_gguf

PAGE = Path(__file__).resolve().parents[3] / "docs" / "adding-a-model-architecture.md"
VOCAB = 96


def python_blocks() -> list[str]:
    """The page's fenced python blocks, in order: the row, then the steps that check it."""
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def toycoder(seed: int = 0) -> torch.nn.Module:
    """A tiny ToyCoder: transformers' Llama under the model type ``toycoder``, its norms away from
    their defaults so that a forward that skipped one would differ."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
    )
    config.model_type = "toycoder"
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.5)
    return model.eval()


@pytest.fixture
def added_row(monkeypatch) -> Architecture:
    """The page's row, run as written (its ``...`` standing for the rows already there) and added
    to the table for this test only."""
    edited = dict(vars(architectures))
    exec(python_blocks()[0], edited)
    rows = [row for row in edited["ARCHITECTURES"] if row is not Ellipsis]
    assert len(rows) == 1 and isinstance(rows[0], Architecture)
    monkeypatch.setattr(architectures, "ARCHITECTURES", [*architectures.ARCHITECTURES, *rows])
    return rows[0]


def lean_greedy(forward, prompt: list[int], count: int) -> list[int]:
    """``count`` greedy tokens after ``prompt`` on the lean forward: the prompt in one pass, then
    one token a pass on its cache."""
    cache = forward.new_cache()
    logits = forward(prompt, cache)[-1]
    out = []
    for _ in range(count):
        out.append(int(logits.argmax()))
        logits = forward(out[-1:], cache)[-1]
    return out


def transformers_greedy(model: torch.nn.Module, prompt: list[int], count: int) -> list[int]:
    """The same on transformers' own forward, the whole sequence every step."""
    ids = list(prompt)
    for _ in range(count):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_without_the_row_the_family_is_not_covered(tmp_path):
    """The starting point the page describes: the table does not know ToyCoder."""
    assert gguf_architecture("toycoder") is None and transformers_architecture("toycoder") is None
    write_gguf(toycoder(), "toycoder", tmp_path / "toycoder.gguf", permute_qk=False)
    facts = gguf_facts(tmp_path / "toycoder.gguf")
    assert not facts.fast and "architecture 'toycoder'" in facts.reason
    with pytest.raises(UnsupportedModel, match="toycoder"):
        from_transformers(toycoder(), bits=0)


def test_the_pages_steps_put_a_new_family_on_the_lean_forward(
    added_row, tmp_path, monkeypatch, kernel_backend
):
    """The file lists as fast, loads and computes transformers' logits, on either kernel backend,
    and greedy decoding on it picks transformers' tokens."""
    assert added_row == Architecture("toycoder", "toycoder", gguf_rotate_half=True)
    model = toycoder()
    write_gguf(model, "toycoder", tmp_path / "toycoder.gguf", permute_qk=False)  # NEOX: rows as they are
    monkeypatch.chdir(tmp_path)
    steps: dict = {}
    for block in python_blocks()[1:]:
        exec(block, steps)
    assert steps["facts"].fast and steps["facts"].architecture == "toycoder"

    forward = steps["forward"]
    tokens = [random.Random(5).randrange(VOCAB) for _ in range(40)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    got = forward(tokens, forward.new_cache())
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert torch.allclose(steps["logits"], model(input_ids=torch.tensor([[1, 2, 3]])).logits[0], atol=1e-4)

    prompt = tokens[:8]
    assert lean_greedy(forward, prompt, 24) == transformers_greedy(model, prompt, 24)


def test_a_transformers_model_of_the_new_type_runs_on_the_lean_forward_too(added_row):
    model = toycoder(seed=1)
    forward = from_transformers(model, bits=0)
    tokens = [random.Random(6).randrange(VOCAB) for _ in range(40)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    got = forward(tokens, forward.new_cache())
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
