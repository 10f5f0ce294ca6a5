"""Acceptance rules for speculative decoding, as pure functions over logits and probabilities.

Greedy acceptance keeps draft tokens while they equal the target's argmax, so the output is
token-for-token the target's own greedy output. Speculative sampling (Leviathan et al. 2023,
Chen et al. 2023) accepts a draft token x with probability min(1, p(x)/q(x)) and on rejection
resamples from normalize(max(0, p - q)), which leaves the output distributed exactly as plain
sampling from p. Both return the tokens to emit: the accepted drafts plus one token from the
target (the correction, or a bonus token when every draft was accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits. temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Acceptance:
    tokens: list[int]  # accepted draft tokens followed by exactly one target token
    accepted: int  # how many of the draft tokens were kept


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution plain sampling draws from: temperature, then top-k, then top-p.

    Works on ``(..., vocab)`` logits and returns float32 probabilities of the same shape. The
    same function shapes both the target's p and a sampling drafter's q, which is what makes the
    acceptance rule exact for the processed distribution.
    """
    logits = logits.float() / max(params.temperature, 1e-6)
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # always keeps the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)  # the engine's generator lives on the CPU
    return int(torch.multinomial(probs, 1, generator=generator).item())


def greedy_accept(draft: list[int], target_logits: torch.Tensor) -> Acceptance:
    """``target_logits[i]`` predicts the token after draft position i-1; it has ``len(draft)+1`` rows."""
    choices = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return Acceptance(tokens=draft[:accepted] + [choices[accepted]], accepted=accepted)


def speculative_accept(
    draft: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Acceptance:
    """Speculative sampling over ``target_probs`` (``len(draft)+1`` rows of p).

    ``draft_probs`` holds q, the rows the drafter actually sampled each token from; None means
    a deterministic draft, i.e. q is one-hot on the drafted token. Then min(1, p/q) is p(x) and
    the residual max(0, p - q) is p with x removed.
    """
    for i, token in enumerate(draft):
        p = target_probs[i]
        if draft_probs is None:
            q_token = 1.0
            residual = p.clone()
            residual[token] = 0.0
        else:
            q = draft_probs[i]
            q_token = float(q[token])
            residual = torch.clamp(p - q, min=0.0)
        p_token = float(p[token])
        u = float(torch.rand((), generator=generator))
        if q_token > 0 and u < min(1.0, p_token / q_token):
            continue
        total = float(residual.sum())
        # p == q up to rounding leaves no residual mass; p itself is then the right distribution.
        correction = sample(residual / total if total > 1e-12 else p, generator)
        return Acceptance(tokens=draft[:i] + [correction], accepted=i)
    bonus = sample(target_probs[len(draft)], generator)
    return Acceptance(tokens=list(draft) + [bonus], accepted=len(draft))
