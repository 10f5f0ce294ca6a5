"""The draft head's network: its rotary table and its fused form compute what the plain head does."""

from __future__ import annotations

import copy

import torch

from speculative_complete.decoding.draft_head.network import HeadCache, HeadConfig, Rotary
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from tests.support.draft_heads import tiny_head
from tests.support.tiny_models import tiny_model


def test_rotary_from_its_table_is_rotate_half_rotary_at_any_position():
    """The table (grown on demand, fp32 whatever the input's dtype) gives what computing each
    position's angles does, before and after it grows, for positions in any order."""
    config = HeadConfig(dim=64, heads=4, kv_heads=2, ffn=128, rope_theta=10000.0)
    rotary = Rotary(config)
    torch.manual_seed(0)
    for positions in (torch.tensor([3, 0, 7]), torch.tensor([500, 64, 129]), torch.arange(10)):
        x = torch.randn(2, len(positions), 3, config.head_dim)
        angles = positions[:, None].double() * rotary.inverse_freq.double()[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]
        first, second = x.double().chunk(2, dim=-1)
        expected = x.double() * cos + torch.cat([-second, first], dim=-1) * sin
        assert torch.allclose(rotary(x, positions).double(), expected, atol=1e-4)
    assert len(rotary.cos) >= 501 and rotary.cos.dtype == torch.float32


@torch.no_grad()
def test_a_fused_head_computes_what_the_trained_one_does():
    """Drafting's head (q/k/v and gate/up each one product, ``DraftHead.fuse``) gives the same g
    as the head training saves, over a prefix pass and chained one-row steps with a cache, at
    positions past the rotary table's first size."""
    forward = from_transformers(tiny_model(5, layers=1), 0)
    head = tiny_head(forward, seed=3)
    fused = copy.deepcopy(head).fuse()
    assert fused.layers[0].self_attn.qkv is not None and not hasattr(fused.layers[0].mlp, "up_proj")
    torch.manual_seed(2)
    rows, first = 5, 90
    hidden, embeds = torch.randn(1, rows + 3, forward.shape.dim), torch.randn(1, rows + 3, forward.shape.dim)
    caches, outputs = [HeadCache(), HeadCache()], [[], []]
    for model, cache, out in zip((head, fused), caches, outputs, strict=True):
        mask = torch.ones(rows, rows, dtype=torch.bool).tril_()
        positions = torch.arange(first, first + rows)
        g = model(hidden[:, :rows], embeds[:, :rows], positions, mask, cache)
        out.append(g)
        for entry in range(rows, rows + 3):
            g = model(g[:, -1:], embeds[:, entry : entry + 1], torch.tensor([first + entry]), None, cache)
            out.append(g)
    for plain, joined in zip(*outputs, strict=True):
        assert torch.allclose(plain, joined, atol=1e-5)
    assert caches[1].length == rows + 3
