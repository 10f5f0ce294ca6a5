"""A ``LlamaForward`` put together from any source of weights: the one assembly both loaders
(``gguf_loader.py``, ``transformers_loader.py``) and the graphed forward share, and the row orders
that take q's and k's rotate-half rows to the adjacent pairs the forward's rotary acts on.

A loader hands ``assemble`` three functions over its own storage (``LinearSource``,
``VectorSource``, ``OptionalSource``); everything that differs between a file and a checkpoint
stays in the loader.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from speculative_complete.decoding.forward.llama import Embedding, LlamaForward, LlamaLayer
from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.quant.gguf_blocks import QuantTensor
from speculative_complete.decoding.forward.quant.layers import concat_rows, linear_for
from speculative_complete.decoding.forward.shapes import LlamaShape

# layer i's product over the weights named (``PRODUCTS``' parts), side by side in one output
LinearSource = Callable[[tuple[str, ...], int], torch.nn.Module]
# a norm's fp32 weights: layer i's ``attn_norm`` or ``ffn_norm``, or (i None) the final norm
VectorSource = Callable[[str, int | None], torch.Tensor]
# layer i's fp32 ``q_bias``, ``k_bias``, ``v_bias``, ``q_norm`` or ``k_norm``; None where it has none
OptionalSource = Callable[[str, int], torch.Tensor | None]


def pair_orders(shape: LlamaShape) -> dict[str, np.ndarray]:
    """Row orders taking q's and k's rotate-half rows (and their biases) to adjacent pairs."""
    return {
        "q": rope_order(shape.attention_dim, shape.heads),
        "k": rope_order(shape.kv_heads * shape.head_dim, shape.kv_heads),
    }


def rope_order(rows: int, heads: int) -> np.ndarray:
    """Row order taking a transformers q/k projection (rotate-half pairs) to adjacent pairs."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


# The products of a layer, each over the weights named (one output, side by side).
PRODUCTS = {"qkv": ("q", "k", "v"), "out": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def assemble(
    shape: LlamaShape,
    linear: LinearSource,
    vector: VectorSource,
    embed: Embedding,
    head: torch.nn.Module,
    optional: OptionalSource | None = None,
    native: Kernels | None = None,
) -> LlamaForward:
    """``linear(names, i)`` gives layer i's product over the weights ``names`` (``PRODUCTS``),
    ``vector(name, i)`` a norm's fp32 weights, ``optional(name, i)`` an fp32 bias (``q_bias``,
    ``k_bias``, ``v_bias``) or head norm (``q_norm``, ``k_norm``) where the model has one."""
    optional = optional or (lambda name, i: None)
    layers = []
    for i in range(shape.layers):
        products = {name: linear(parts, i) for name, parts in PRODUCTS.items()}
        layers.append(
            LlamaLayer(
                attn_norm=vector("attn_norm", i),
                ffn_norm=vector("ffn_norm", i),
                **products,
                qkv_bias=joined_qkv_bias(shape, [optional(f"{x}_bias", i) for x in "qkv"]),
                q_norm=optional("q_norm", i),
                k_norm=optional("k_norm", i),
            )
        )
    return LlamaForward(shape, embed, layers, vector("norm", None), head, native)


def torch_linear(weight: Callable[[str, int], QuantTensor]) -> LinearSource:
    """``linear`` for ``assemble`` from ``weight(name, i)``'s QuantTensors: torch's kernels."""

    def linear(names: tuple[str, ...], i: int) -> torch.nn.Module:
        parts = [weight(name, i) for name in names]
        return linear_for(parts[0] if len(parts) == 1 else concat_rows(parts))

    return linear


def joined_qkv_bias(shape: LlamaShape, biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    """q, k and v's biases as one vector (a missing one zeros); None where the model has none."""
    if all(b is None for b in biases):
        return None
    sizes = [shape.heads * shape.head_dim] + [shape.kv_heads * shape.head_dim] * 2
    return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, sizes, strict=True)])
