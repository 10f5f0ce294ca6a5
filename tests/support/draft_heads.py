"""Tiny draft heads trained in seconds on a tiny target's own greedy text: enough for the head
drafter's exactness and losslessness tests, on any forward."""

from __future__ import annotations

import torch

from speculative_complete.decoding.draft_head.network import DraftHead, HeadConfig
from speculative_complete.decoding.draft_head.training import chain_loss
from tests.support.lean_forward import plain_greedy_pass
from tests.support.tiny_models import TINY_VOCAB

# The head scores these tokens of the tiny vocabulary (the rest can never be drafted): 48 rows,
# whole 16s, so that with ``bits`` they are scored on the 4-bit kernel as the shipped head's are.
HEAD_VOCAB = torch.arange(16, TINY_VOCAB)


def tiny_head(forward, seed: int = 0, vocab: torch.Tensor = HEAD_VOCAB) -> DraftHead:
    torch.manual_seed(seed)
    s = forward.shape
    config = HeadConfig(
        s.dim, s.heads, s.kv_heads, s.ffn, s.rope_theta, s.norm_eps, True, forward.fingerprint
    )
    return DraftHead(config, vocab)


def own_sequences(forward, count: int, length: int, seed: int) -> list[list[int]]:
    """The target's own greedy continuations of random prompts: what the head learns to draft."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        prompt = torch.randint(0, TINY_VOCAB, (6,), generator=g).tolist()
        out.append(prompt + plain_greedy_pass(forward, prompt, length - len(prompt)))
    return out


def hidden_states(forward, tokens: list[int]) -> torch.Tensor:
    cache = forward.new_cache()
    forward(tokens, cache)
    return cache.hidden[: len(tokens)].clone()


def trained_tiny_head(forward, steps: int = 120, seed: int = 0) -> DraftHead:
    head = tiny_head(forward, seed)
    sequences = own_sequences(forward, 24, 48, seed)
    tokens = torch.tensor(sequences)
    hidden = torch.stack([hidden_states(forward, s) for s in sequences])
    embeds = forward.embed(tokens[:, 1:].reshape(-1)).view(len(sequences), -1, forward.shape.dim)
    rows = forward.output_rows(head.vocab)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = chain_loss(head, hidden, embeds, rows, depth=2, noise=0.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()
