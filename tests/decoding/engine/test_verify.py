"""The acceptance rules as pure functions."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from speculative_complete.decoding.verify import (
    SamplingParams,
    greedy_accept,
    sampling_probs,
    speculative_accept,
)


def one_hot_logits(choices: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(choices), vocab)
    for row, token in enumerate(choices):
        logits[row, token] = 5.0
    return logits


def test_greedy_accepts_the_matching_prefix_then_the_targets_token():
    logits = one_hot_logits([3, 4, 5, 6])
    assert greedy_accept([3, 4, 5], logits).tokens == [3, 4, 5, 6]  # all accepted + bonus
    verdict = greedy_accept([3, 7, 5], logits)
    assert verdict.tokens == [3, 4] and verdict.accepted == 1
    verdict = greedy_accept([1, 4, 5], logits)
    assert verdict.tokens == [3] and verdict.accepted == 0
    assert greedy_accept([], logits[:1]).tokens == [3]


def test_sampling_probs_applies_temperature_top_k_and_top_p_like_plain_sampling():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    plain = torch.softmax(logits / 0.5, dim=-1)
    assert torch.allclose(sampling_probs(logits, SamplingParams(0.5)), plain)
    top2 = sampling_probs(logits, SamplingParams(1.0, top_k=2))
    assert (top2[2:] == 0).all()
    assert torch.allclose(top2[:2], torch.softmax(logits[:2], dim=-1))
    nucleus = sampling_probs(logits, SamplingParams(1.0, top_p=0.7))
    full = torch.softmax(logits, dim=-1)
    assert full[0] < 0.7 < full[0] + full[1]  # so exactly the two most likely survive
    assert (nucleus[2:] == 0).all() and torch.allclose(nucleus[:2], full[:2] / full[:2].sum())


def _first_token_counts(p: torch.Tensor, q: torch.Tensor | None, draft_token_fn, n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.shape[-1])
    for _ in range(n):
        token = draft_token_fn(generator)
        verdict = speculative_accept(
            [token], None if q is None else q.unsqueeze(0), torch.stack([p, p]), generator
        )
        counts[verdict.tokens[0]] += 1
    return counts


def test_speculative_acceptance_keeps_the_target_distribution_for_sampled_and_fixed_drafts():
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    q = torch.tensor([0.4, 0.1, 0.4, 0.1])

    def sampled(g: torch.Generator) -> int:
        return int(torch.multinomial(q, 1, generator=g))

    counts = _first_token_counts(p, q, sampled, 5000, seed=1)
    assert chisquare(counts.numpy(), (p * 5000).numpy()).pvalue > 0.001
    # A deterministic draft (q one-hot) of the least likely token.
    counts = _first_token_counts(p, None, lambda g: 0, 5000, seed=2)
    assert chisquare(counts.numpy(), (p * 5000).numpy()).pvalue > 0.001


def test_the_chi_square_check_has_power_against_a_wrong_rule():
    """Accepting every sampled draft gives q, not p; the same check must reject that."""
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    q = torch.tensor([0.4, 0.1, 0.4, 0.1])
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    for _ in range(5000):
        counts[int(torch.multinomial(q, 1, generator=g))] += 1
    assert chisquare(counts.numpy(), (p * 5000).numpy()).pvalue < 1e-6


def test_bonus_token_when_all_drafts_accepted():
    p = torch.zeros(3, 5)
    p[0, 1] = p[1, 2] = p[2, 4] = 1.0
    verdict = speculative_accept([1, 2], None, p, torch.Generator().manual_seed(0))
    assert verdict.tokens == [1, 2, 4] and verdict.accepted == 2
