"""A model's shape as the lean forward reads it from a GGUF header or a transformers config, and
the refusal (``UnsupportedModel``, with the reason) of a model it does not cover.

Both checks ask the architecture table (``architectures.py``); the GGUF one is also what
``lsp_server --list-models`` reports as the fast path, before any weight is read. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speculative_complete.decoding.forward.architectures import (
    LAYER_TENSORS,
    Architecture,
    gguf_architecture,
    gguf_names,
    transformers_architecture,
)
from speculative_complete.decoding.forward.gguf_header import GgufHeader


class UnsupportedModel(ValueError):
    """The lean forward does not cover this model; the caller falls back to transformers'."""


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float
    max_context: int
    head_size: int = 0  # per attention head; 0: dim // heads (Qwen3's heads are wider)
    rope_scale: float = 1.0  # linear rotary scaling: positions are divided by it (DeepSeek-Coder)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.heads

    @property
    def attention_dim(self) -> int:
        """The width attention's output has, the output projection's input."""
        return self.heads * self.head_dim

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def gguf_family(header: GgufHeader) -> Architecture:
    """The table's row for a GGUF's architecture; ``UnsupportedModel`` where it has none."""
    arch = header.get("general.architecture")
    architecture = gguf_architecture(arch)
    if architecture is None:
        raise UnsupportedModel(f"architecture {arch!r} (covered: {', '.join(gguf_names())})")
    return architecture


def gguf_shape(header: GgufHeader) -> LlamaShape:
    """The model's shape from a GGUF header; ``UnsupportedModel`` (with the reason) where the
    lean forward does not cover it."""
    arch = gguf_family(header).gguf_name
    extra = {name.split(".", 2)[2] for name in header.tensors if name.startswith("blk.")} - LAYER_TENSORS
    if extra:
        raise UnsupportedModel(f"layer tensors {', '.join(sorted(extra))}")
    dim = int(header.get(f"{arch}.embedding_length"))
    heads = int(header.get(f"{arch}.attention.head_count"))
    head_dim = int(header.get(f"{arch}.attention.key_length", dim // heads))
    if int(header.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise UnsupportedModel("values of another width than keys")
    if int(header.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModel("partial rotary")
    return LlamaShape(
        layers=int(header.get(f"{arch}.block_count")),
        dim=dim,
        heads=heads,
        kv_heads=int(header.get(f"{arch}.attention.head_count_kv", heads)),
        ffn=int(header.get(f"{arch}.feed_forward_length")),
        vocab=int(header.tensors["token_embd.weight"].shape[0]),
        rope_theta=float(header.get(f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=float(header.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_context=int(header.get(f"{arch}.context_length", 2048)),
        head_size=head_dim if head_dim != dim // heads else 0,
        rope_scale=_rope_scale(header, arch),
    )


def _rope_scale(header: GgufHeader, arch: str) -> float:
    """Linear rotary scaling's factor (1 without scaling); any other kind is not covered."""
    kind = header.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return 1.0
    if kind != "linear":
        raise UnsupportedModel(f"rotary scaling {kind!r}")
    return float(header.get(f"{arch}.rope.scaling.factor", 1.0))


def _rope(config: Any) -> tuple[dict[str, Any], str]:
    """A transformers config's rotary parameters, and their kind (``default`` where unnamed)."""
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 10000.0)}
    return rope, rope.get("rope_type", rope.get("type", "default"))


def transformers_family(config: Any) -> Architecture:
    """The table's row for a transformers config's model type; ``UnsupportedModel`` where it has none."""
    model_type = getattr(config, "model_type", "")
    architecture = transformers_architecture(model_type)
    if architecture is None:
        raise UnsupportedModel(f"model type {model_type!r} with rope {_rope(config)[0]}")
    return architecture


def transformers_shape(config: Any) -> LlamaShape:
    """The lean forward's shape for a transformers config; ``UnsupportedModel`` where it does
    not cover the model (another layout, sliding windows, rotary scaling other than linear)."""
    architecture = transformers_family(config)
    rope, rope_type = _rope(config)
    if rope_type not in ("default", "linear"):
        raise UnsupportedModel(f"model type {config.model_type!r} with rope {rope}")
    if getattr(config, "mlp_bias", False) or getattr(config, "use_sliding_window", False):
        raise UnsupportedModel("biases in the feed-forward or sliding-window attention")
    if architecture.output_bias_with_attention_bias and getattr(config, "attention_bias", False):
        raise UnsupportedModel("an output projection bias")
    dim, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or dim // heads
    return LlamaShape(
        layers=config.num_hidden_layers,
        dim=dim,
        heads=heads,
        kv_heads=config.num_key_value_heads,
        ffn=config.intermediate_size,
        vocab=config.vocab_size,
        rope_theta=float(rope["rope_theta"]),
        norm_eps=config.rms_norm_eps,
        max_context=config.max_position_embeddings,
        head_size=head_dim if head_dim != dim // heads else 0,
        rope_scale=float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
    )
