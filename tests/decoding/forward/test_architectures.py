"""The lean forward covers the code models users run: Qwen2 (q/k/v biases, a large rotary base,
tied or untied output), Qwen3 (per-head q/k norms, heads wider than hidden / heads) and Llama
with linear rotary scaling (DeepSeek-Coder). Each is checked against transformers' own forward
on the same tiny random weights, loaded from transformers and from a GGUF file written as
llama.cpp's converter writes it, and speculative greedy decoding on it equals plain greedy."""

from __future__ import annotations

import mmap
import random

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
)

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward import llama
from speculative_complete.decoding.forward.gguf_loader import from_gguf
from speculative_complete.decoding.forward.shapes import UnsupportedModel
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from tests.support.lean_forward import lean_loaded, plain_greedy_pass
from tests.support.tiny_architectures import COMMON, VOCAB, tiny, write_gguf

CASES = [("qwen2", False), ("qwen2", True), ("qwen3", False), ("llama", True)]


@pytest.mark.parametrize("arch,tied", CASES)
def test_the_lean_forward_computes_what_transformers_does(arch, tied):
    model = tiny(arch, tied)
    forward = from_transformers(model, bits=0)
    tokens = [random.Random(1).randrange(VOCAB) for _ in range(300)]  # past the first rotary periods
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    cache = forward.new_cache()
    got = torch.cat(
        [forward(tokens[:200], cache), forward(tokens[200:201], cache), forward(tokens[201:], cache)]
    )
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_the_rotary_table_grows_with_the_positions_reached_and_changes_nothing(monkeypatch):
    """The table starts at one chunk and grows, a chunk at a time, as passes reach further (a
    32k context's would be 16 MB); passes across its growth give what a whole table gives."""
    model = tiny("qwen2")
    whole = from_transformers(model, bits=0)
    monkeypatch.setattr(llama, "ROTARY_CHUNK", 64)
    grown = from_transformers(model, bits=0)
    assert len(grown.rotary) == 64 and len(whole.rotary) == COMMON["max_position_embeddings"]
    tokens = [random.Random(3).randrange(VOCAB) for _ in range(300)]
    outputs = []
    for forward in (grown, whole):
        cache = forward.new_cache()
        outputs.append(torch.cat([forward(tokens[a:b], cache) for a, b in ((0, 50), (50, 200), (200, 300))]))
    assert torch.equal(outputs[0], outputs[1])
    assert len(grown.rotary) == 320


@pytest.mark.parametrize("arch,tied", CASES)
def test_a_gguf_as_llama_cpp_writes_it_loads_onto_the_lean_forward(arch, tied, tmp_path, kernel_backend):
    model = tiny(arch, tied)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(model, arch, path)
    forward = from_gguf(str(path))
    tokens = [random.Random(2).randrange(VOCAB) for _ in range(120)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    got = forward(tokens, forward.new_cache())
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    if kernel_backend == "native":  # every weight is the file's mapped blocks, q and k included
        products = [m for layer in forward.layers for m in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        assert all(_file_backed(w.blocks) for m in products for w in m.weights)


def _file_backed(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory-mapped file (not a copy of one)."""
    base: object = array
    while isinstance(base, np.ndarray):
        if base.base is None:
            return False
        base = base.base
    if isinstance(base, memoryview):  # numpy.frombuffer's base: a view of the mapping
        base = base.obj
    return isinstance(base, mmap.mmap)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_speculative_greedy_on_a_quantized_code_model_equals_its_plain_greedy(arch, tmp_path, kernel_backend):
    """The file's Q8_0 blocks on either backend (the output layer certified exact): 60 cases,
    drafts kept and rejected, equal to the model's own plain greedy decoding."""
    path = tmp_path / f"{arch}.gguf"
    write_gguf(tiny(arch, seed=3), arch, path, QType.Q8_0)
    forward = from_gguf(str(path))
    proposed = accepted = 0
    rng = random.Random(4)
    for _ in range(60):
        motif = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
        prompt = (motif * rng.randint(1, 4))[: rng.randint(1, 20)] + [rng.randrange(VOCAB)]
        want = plain_greedy_pass(forward, prompt, 24)
        engine = SpeculativeEngine(lean_loaded(forward))
        result = engine.generate(
            prompt, GenerationConfig(max_new_tokens=24), make_drafter("ngram", max_draft=4)
        )
        assert result.token_ids == want
        for stats in result.stats.drafters.values():
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert proposed > 0 and accepted > 0


def test_what_the_lean_forward_does_not_cover_is_refused_with_the_reason(tmp_path):
    """Another rotary scaling, or a layer tensor the forward does not read, falls back to
    transformers' forward with a reason the log can say."""
    config = LlamaConfig(**COMMON, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(UnsupportedModel, match="rope"):
        from_transformers(LlamaForCausalLM(config), bits=0)
    model = tiny("qwen2")
    path = tmp_path / "odd.gguf"
    model.model.layers[0].self_attn.o_proj.bias = torch.nn.Parameter(torch.zeros(COMMON["hidden_size"]))
    write_gguf(model, "qwen2", path)
    with pytest.raises(UnsupportedModel, match=r"attn_output\.bias"):
        from_gguf(str(path))
