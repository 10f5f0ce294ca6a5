"""Plain decoding, written independently of the engine, as the ground truth tests compare to."""

from __future__ import annotations

import torch
from transformers import DynamicCache


@torch.inference_mode()
def plain_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """One token per forward pass with a KV cache; no EOS handling (callers cut where they need)."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0, -1]
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(logits.argmax())
        out.append(token)
        logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return out


@torch.inference_mode()
def next_token_logits(model, tokens: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]
