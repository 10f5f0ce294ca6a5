"""GGUF files of tiny transformers models, laid out as llama.cpp's converter writes them, so that the
lean forward's GGUF loader reads a real file's layout."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFWriter, quants

from speculative_complete.decoding.forward.assembly import rope_order

# A decoder layer's modules (transformers' names) and the GGUF tensor each becomes.
GGUF_TENSORS = {
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


def write_gguf(
    model: torch.nn.Module, arch: str, path: Path | str, permute_qk: bool, kind: QType = QType.F32
) -> None:
    """``model`` as a GGUF of architecture ``arch``: weights in ``kind``, norms and biases in F32,
    no output tensor where the embedding is tied. ``permute_qk``: q's and k's rows permuted into
    adjacent pairs, as llama.cpp's converter does for a family it ropes in pairs (llama's); else
    kept in the checkpoint's rotate-half order (its NEOX rotary: Qwen's)."""
    config = model.config
    writer = GGUFWriter(str(path), arch)
    _write_header(writer, config)
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
        for module_name, short in GGUF_TENSORS.items():
            try:
                module = layer.get_submodule(module_name)
            except AttributeError:  # a part this family does not have (head norms)
                continue
            for part in ("weight", "bias"):
                tensor = getattr(module, part, None)
                if tensor is None:
                    continue
                values = tensor.detach().numpy().copy()
                if permute_qk and short in heads:
                    values = values[rope_order(values.shape[0], heads[short])]
                add(f"blk.{i}.{short}.{part}", values, part == "weight" and values.ndim == 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_header(writer: GGUFWriter, config) -> None:
    """The shape, norm and rotary keys of a transformers config."""
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
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
