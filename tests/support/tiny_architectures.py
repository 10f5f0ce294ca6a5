"""Tiny random models of each supported architecture (Qwen2, Qwen3, Llama) and a GGUF writer that
lays them out as llama.cpp's converter does, so that the forward's loaders read real file layouts."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QType
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from tests.support import ggufs

VOCAB = 96

COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}


def tiny(arch: str, tied: bool = False, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of ``arch``, its norms and biases away from their defaults so that a
    forward that skipped one would differ."""
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=tied))
    elif arch == "qwen3":
        config = Qwen3Config(**COMMON, head_dim=32, rope_theta=1e6, tie_word_embeddings=tied)
        model = Qwen3ForCausalLM(config)
    else:
        scaling = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5}
        model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=scaling, tie_word_embeddings=tied))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.5)
    return model.eval()


def write_gguf(model: torch.nn.Module, arch: str, path, kind: QType = QType.F32) -> None:
    """``model`` as llama.cpp's converter writes it: llama's q/k rows permuted into adjacent
    pairs, Qwen's left as they are (rotate-half, NEOX rotary)."""
    ggufs.write_gguf(model, arch, path, permute_qk=arch == "llama", kind=kind)
