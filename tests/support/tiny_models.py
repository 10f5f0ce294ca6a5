"""Tiny seeded random-weight Llama models for testing mechanics in milliseconds.

Draft and target share a vocabulary and differ in depth and seed. ``save_tiny_model`` writes a
model plus the real SmolLM2 tokenizer to a folder, for tests that start the server process.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from speculative_complete.decoding.models.loading import LoadedModel

TINY_VOCAB = 64


def tiny_config(
    vocab_size: int = TINY_VOCAB,
    layers: int = 2,
    hidden: int = 32,
    max_positions: int = 256,
    eos_token_id: int | None = None,
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )


def tiny_model(
    seed: int,
    layers: int = 2,
    vocab_size: int = TINY_VOCAB,
    hidden: int = 32,
    max_positions: int = 256,
    eos_token_id: int | None = None,
    logit_scale: float = 1.0,
) -> LlamaForCausalLM:
    """A random model; ``logit_scale`` > 1 sharpens its distributions (repetitive greedy output)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(vocab_size, layers, hidden, max_positions, eos_token_id))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


class TinyTokenizer:
    """Enough of a tokenizer for the engine: token i is the character chr(ord('a') + i) or a newline."""

    bos_token_id = None
    eos_token_id = None

    def __init__(self, vocab_size: int = TINY_VOCAB, newline_id: int = 10) -> None:
        self.vocab_size, self.newline_id = vocab_size, newline_id

    def piece(self, token: int) -> str:
        return "\n" if token == self.newline_id else chr(0x100 + token)

    def decode(self, tokens, skip_special_tokens: bool = False) -> str:
        return "".join(self.piece(int(t)) for t in tokens)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [self.newline_id if ch == "\n" else ord(ch) - 0x100 for ch in text]}

    def get_vocab(self) -> dict[str, int]:
        return {self.piece(i): i for i in range(self.vocab_size)}

    added_tokens_decoder: ClassVar[dict] = {}  # no special tokens: only the limit ends a generation


def loaded(model: LlamaForCausalLM, tokenizer=None) -> LoadedModel:
    return LoadedModel(
        model=model,
        tokenizer=tokenizer or TinyTokenizer(model.config.vocab_size),
        device=torch.device("cpu"),
        dtype=torch.float32,
        source="tiny",
    )


def save_tiny_model(folder: Path, tokenizer_source: Path, seed: int = 0, layers: int = 2) -> Path:
    """A tiny random model with the real tokenizer of ``tokenizer_source``, saved as safetensors."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    model = tiny_model(
        seed,
        layers=layers,
        vocab_size=len(tokenizer),
        max_positions=2048,
        eos_token_id=tokenizer.eos_token_id,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
