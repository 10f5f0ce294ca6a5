"""A transformers model onto the lean forward (``from_transformers``): its linear layers quantized
at load, its q and k rows (rotate-half pairs in every transformers checkpoint) permuted into the
adjacent pairs the forward's rotary acts on. Which model types it takes, and whether they have
per-head q/k norms, is the architecture table's (``architectures.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from speculative_complete.decoding.forward.assembly import assemble, pair_orders, rope_order, torch_linear
from speculative_complete.decoding.forward.llama import DenseEmbedding, Embedding, LlamaForward
from speculative_complete.decoding.forward.native.serving import kernels
from speculative_complete.decoding.forward.quant.gguf_blocks import QuantTensor, quantize_dense
from speculative_complete.decoding.forward.quant.layers import (
    INT4_N_MULTIPLE,
    DenseOutputLayer,
    QuantizedOutputLayer,
)
from speculative_complete.decoding.forward.shapes import transformers_family, transformers_shape

# The parts ``assembly`` asks for, as a transformers decoder layer names its modules.
TRANSFORMERS_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
}


def from_transformers(model: torch.nn.Module, bits: int) -> LlamaForward:
    """A transformers model of a type the architecture table holds (Llama, Qwen2, Qwen3), its
    linear layers quantized at load (``bits`` 4 or 8; 0 keeps them dense fp32, which the tests
    use to check this forward against transformers'). Its q and k rows (rotate-half pairs) are
    permuted into adjacent pairs."""
    shape = transformers_shape(model.config)
    blocks = model.model.layers
    pairs, head_norms = pair_orders(shape), transformers_family(model.config).head_norms

    def weight(kind: str, i: int) -> QuantTensor:
        w = blocks[i].get_submodule(TRANSFORMERS_NAMES[kind]).weight.detach().float().numpy()
        if kind in pairs:
            w = w[pairs[kind]]
        if not bits or w.shape[1] % 32:
            return QuantTensor(w.shape, "F32", values=np.ascontiguousarray(w))
        return quantize_dense(w, bits)

    def vector(kind: str, i: int | None) -> torch.Tensor:
        module = model.model.norm if i is None else blocks[i].get_submodule(TRANSFORMERS_NAMES[kind])
        return module.weight.detach().float().clone()

    def optional(kind: str, i: int) -> torch.Tensor | None:
        layer = blocks[i]
        if kind.endswith("_norm"):
            if not head_norms:
                return None
            weights = layer.get_submodule(TRANSFORMERS_NAMES[kind]).weight.detach().float()
            return weights[rope_order(shape.head_dim, 1)].clone()
        bias = layer.get_submodule(TRANSFORMERS_NAMES[kind[0]]).bias
        if bias is None:
            return None
        values = bias.detach().float()
        return values[pairs[kind[0]]].clone() if kind[0] in pairs else values.clone()

    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    head_weight = model.lm_head.weight.detach().float()
    table = model.model.embed_tokens.weight.detach().float().clone()
    if bits and head_weight.shape[0] % INT4_N_MULTIPLE == 0 and head_weight.shape[1] % 32 == 0:
        # As GGUF files keep it: the output layer in 8 bits (Q8_0), whatever the rest.
        head: torch.nn.Module = QuantizedOutputLayer(quantize_dense(head_weight.numpy(), 8))
        embed: Embedding = head.rows if tied else DenseEmbedding(table)
    else:
        head = DenseOutputLayer(head_weight)
        embed = DenseEmbedding(head.weight if tied else table)
    forward = assemble(shape, torch_linear(weight), vector, embed, head, optional, kernels())
    forward.formats = f"int{bits}" if bits else "F32"
    return forward
