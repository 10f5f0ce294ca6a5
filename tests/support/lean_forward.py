"""A lean forward as the engine sees it (a ``LoadedModel`` on the tiny tokenizer), and its own
plain greedy decoding: the ground truth for speculative decoding on a quantized forward."""

from __future__ import annotations

import torch

from speculative_complete.decoding.models.loading import LoadedModel
from tests.support.tiny_models import TinyTokenizer, tiny_config


def lean_loaded(forward, eos: int | None = None) -> LoadedModel:
    return LoadedModel(
        model=None,
        tokenizer=TinyTokenizer(),
        device=torch.device("cpu"),
        dtype=torch.float32,
        source="tiny",
        forward=forward,
        config=tiny_config(eos_token_id=eos),
        quantization="int4",
    )


def plain_greedy_pass(forward, prompt: list[int], max_new: int) -> list[int]:
    """The quantized model's own plain decoding: the prompt in one pass, then one token a pass."""
    cache = forward.new_cache()
    logits = forward(prompt, cache)[-1]
    out = []
    for _ in range(max_new):
        out.append(int(logits.argmax()))
        logits = forward(out[-1:], cache)[-1]
    return out
