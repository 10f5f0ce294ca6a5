"""Speculative sampling keeps the target's own sampling distribution, for every drafter.

For tiny random models the exact joint distribution of the first generated tokens is computed
from the model itself; 5000 seeded generations per drafter are compared to it by chi-square.
With max_new_tokens=4 the first token comes from the prefill and the next ones from a verified
draft, so the rejection-resampling and bonus-token paths both shape the tested tokens.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.verify import SamplingParams
from tests.support.sampling import PROMPT, SAMPLES, chi_square_pvalue, exact_joint
from tests.support.tiny_models import loaded, tiny_model


@pytest.fixture(scope="module")
def models():
    target = tiny_model(21, layers=2, logit_scale=3.0)
    draft = tiny_model(22, layers=1, logit_scale=3.0)
    return target, draft


@pytest.mark.parametrize(
    "drafter_name,params",
    [
        ("none", SamplingParams(temperature=1.0, top_k=4)),
        ("ngram", SamplingParams(temperature=0.8, top_k=4)),
        ("model", SamplingParams(temperature=1.0, top_k=4)),
        ("auto", SamplingParams(temperature=1.2, top_k=6, top_p=0.9)),
    ],
)
def test_first_tokens_follow_the_targets_sampling_distribution(models, drafter_name, params):
    target, draft = models
    depth = 2
    joint = exact_joint(target, PROMPT, params, depth)
    engine = SpeculativeEngine(loaded(target))
    drafter = make_drafter(drafter_name, draft_model=loaded(draft), cost=engine.cost, max_draft=3)
    if drafter_name == "auto":
        drafter.MIN_GAIN = 0.0  # always speculate, so the test exercises drafting on every step
    config = GenerationConfig(
        max_new_tokens=4, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p
    )
    counts: dict[tuple[int, ...], int] = {}
    proposed = accepted = 0
    for seed in range(SAMPLES):
        config.seed = seed
        result = engine.generate(PROMPT, config, drafter)
        key = tuple(result.token_ids[:depth])
        counts[key] = counts.get(key, 0) + 1
        for stats in result.stats.drafters.values():
            proposed += stats.proposed
            accepted += stats.accepted
    assert chi_square_pvalue(counts, joint) > 0.001
    if drafter_name != "none":
        assert proposed > SAMPLES // 2, "the drafter should have drafted in most generations"
        assert 0 < accepted < proposed


def test_the_joint_check_detects_a_different_distribution(models):
    """Samples of a different temperature must fail the same check, or the check proves nothing."""
    target, _ = models
    joint = exact_joint(target, PROMPT, SamplingParams(1.0, top_k=4), 2)
    other = exact_joint(target, PROMPT, SamplingParams(0.5, top_k=4), 2)
    g = torch.Generator().manual_seed(0)
    cells = list(other)
    draws = torch.multinomial(torch.tensor([other[c] for c in cells]), SAMPLES, replacement=True, generator=g)
    counts: dict[tuple[int, ...], int] = {}
    for index in draws.tolist():
        counts[cells[index]] = counts.get(cells[index], 0) + 1
    assert chi_square_pvalue(counts, joint) < 1e-6
    assert list(itertools.islice(joint, 1))  # the model has a non-trivial distribution
