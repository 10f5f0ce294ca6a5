"""The model families the lean forward runs, one row each: the one place that says which.

Every row has Llama's layout (RMS norms, rotary attention with grouped keys and values, a SwiGLU
feed-forward, ``LAYER_TENSORS``); a row names the family as a GGUF file and as a transformers
config call it, and the few facts in which the families differ. The GGUF shape check
(``shapes.gguf_shape``, which ``lsp_server --list-models`` asks too), the transformers shape check
(``shapes.transformers_shape``) and both loaders read the table, so a family added here is taken
everywhere at once (``docs/adding-a-model-architecture.md``). Torch-free: the model listing reads
it without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """One family of the lean forward's layout."""

    gguf_name: str  # a GGUF's ``general.architecture``
    model_type: str  # a transformers config's ``model_type``
    # The GGUF keeps q's and k's rows in the rotate-half order of the model's own checkpoint
    # (llama.cpp's NEOX rotary), which loading permutes into adjacent pairs; False where the
    # converter has permuted them already (llama's).
    gguf_rotate_half: bool
    # Each query and key head has its own RMS norm before rotary (Qwen3); a transformers model of
    # this type keeps them as ``self_attn.q_norm`` and ``self_attn.k_norm``. A GGUF's
    # ``attn_q_norm``/``attn_k_norm`` are read wherever the file has them.
    head_norms: bool = False
    # The config's ``attention_bias`` also puts a bias on the output projection, which the lean
    # forward does not have: such a model is refused (Llama's; Qwen2's biases are q, k and v only).
    output_bias_with_attention_bias: bool = False


ARCHITECTURES: list[Architecture] = [
    Architecture("llama", "llama", gguf_rotate_half=False, output_bias_with_attention_bias=True),
    Architecture("qwen2", "qwen2", gguf_rotate_half=True),
    Architecture("qwen3", "qwen3", gguf_rotate_half=True, head_norms=True),
]

# Per-layer GGUF tensors the lean forward reads; a layer holding any other (an output bias, a
# fused q/k/v, experts, extra norms) is another layout's.
LAYER_TENSORS = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
        "attn_q.bias",
        "attn_k.bias",
        "attn_v.bias",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
    }
)


def gguf_architecture(name: object) -> Architecture | None:
    """The row of a GGUF's ``general.architecture``; None where the lean forward does not run it."""
    return next((row for row in ARCHITECTURES if row.gguf_name == name), None)


def transformers_architecture(model_type: object) -> Architecture | None:
    """The row of a transformers ``model_type``; None where the lean forward does not run it."""
    return next((row for row in ARCHITECTURES if row.model_type == model_type), None)


def gguf_names() -> list[str]:
    """Every GGUF architecture the lean forward runs, in the table's order (for messages)."""
    return [row.gguf_name for row in ARCHITECTURES]
