"""The exact joint distribution of a tiny model's first tokens and the chi-square test that
holds seeded speculative samples to it: what "lossless sampling" means in every drafter's test."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from speculative_complete.decoding.verify import SamplingParams, sampling_probs
from tests.support.reference import next_token_logits
from tests.support.tiny_models import TINY_VOCAB

SAMPLES = 5000

# Every token of the vocabulary occurs in the prompt, so the n-gram source always has a match to draft.
PROMPT = list(range(TINY_VOCAB)) + [5, 6, 7, 5, 6, 7, 5, 6]


def exact_joint(model, prompt: list[int], params: SamplingParams, depth: int) -> dict[tuple[int, ...], float]:
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(depth):
        grown: dict[tuple[int, ...], float] = {}
        for prefix, mass in joint.items():
            probs = sampling_probs(next_token_logits(model, prompt + list(prefix)), params)
            for token in torch.nonzero(probs).flatten().tolist():
                grown[prefix + (token,)] = mass * float(probs[token])
        joint = grown
    return joint


def chi_square_pvalue(counts: dict[tuple[int, ...], int], joint: dict[tuple[int, ...], float]) -> float:
    """Cells with small expectations are pooled so the chi-square approximation holds."""
    observed, expected, pool_obs, pool_exp = [], [], 0, 0.0
    for cell, mass in sorted(joint.items(), key=lambda kv: -kv[1]):
        if mass * SAMPLES >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(mass * SAMPLES)
        else:
            pool_obs += counts.get(cell, 0)
            pool_exp += mass * SAMPLES
    pool_obs += sum(n for c, n in counts.items() if c not in joint)
    if pool_exp == 0.0 and pool_obs > 0:
        return 0.0  # samples the distribution cannot produce
    if pool_exp > 0.0:
        observed.append(pool_obs)
        expected.append(pool_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)
