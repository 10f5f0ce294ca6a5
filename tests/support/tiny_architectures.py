"""Tiny random models of each supported architecture (Qwen2, Qwen3, Llama) and a GGUF writer that
lays them out as llama.cpp's converter does, so that the forward's loaders read real file layouts."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFWriter, quants
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from decoding.forward.assembly import rope_order as _rope_order

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
    pairs, Qwen's left as they are (rotate-half, NEOX rotary); weights in ``kind``, norms and
    biases in F32; no output tensor where the embedding is tied."""
    config = model.config
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
    }
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}

    def add(name: str, values: np.ndarray, quantize: bool) -> None:
        if quantize and kind != QType.F32:
            writer.add_tensor(name, quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, values)

    add("token_embd.weight", model.model.embed_tokens.weight.detach().numpy(), True)
    add("output_norm.weight", model.model.norm.weight.detach().numpy(), False)
    if not config.tie_word_embeddings:
        add("output.weight", model.lm_head.weight.detach().numpy(), True)
    for i, layer in enumerate(model.model.layers):
        for module_name, short in names.items():
            if module_name.endswith("_norm") and arch != "qwen3":
                continue
            module = layer.get_submodule(module_name)
            for part in ("weight", "bias"):
                tensor = getattr(module, part, None)
                if tensor is None:
                    continue
                values = tensor.detach().numpy().copy()
                if arch == "llama" and short in heads:
                    values = values[_rope_order(values.shape[0], heads[short])]
                add(f"blk.{i}.{short}.{part}", values, part == "weight" and values.ndim == 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
