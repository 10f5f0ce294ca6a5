"""The 200 seeded greedy cases that every exactness test shares: a prompt, a stopping variant
(token limit, EOS, stop string, end of line) and the output the engine's contract gives, so that
each forward and drafter is held to the same plain greedy decoding."""

from __future__ import annotations

import random

import torch

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from tests.support.lean_forward import plain_greedy_pass
from tests.support.tiny_models import TINY_VOCAB, TinyTokenizer, tiny_model

MAX_NEW = 40


def perturbed_copy(model, seed: int, scale: float):
    """A draft that mostly agrees with the target: its weights plus seeded noise."""
    copy = tiny_model(seed + 1000, layers=model.config.num_hidden_layers)
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(torch.randn(param.shape, generator=g) * scale * param.std().clamp(min=1e-3))
    return copy


def make_case(i: int):
    """Case i: a prompt (often self-repeating, to give n-gram matches) and a stopping variant."""
    rng = random.Random(i)
    motif = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(1, 8))]
    prompt = motif * rng.randint(1, 4) + [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(0, 6))]
    return rng, prompt[: rng.randint(1, len(prompt))], i % 4


def expected_output(reference: list[int], variant: int, rng: random.Random):
    """The engine's contract applied to plain greedy output: (config kwargs, eos, tokens, text)."""
    tok = TinyTokenizer()
    if variant == 0:  # the token limit, often inside a draft
        limit = rng.randint(1, MAX_NEW)
        return {"max_new_tokens": limit}, None, reference[:limit], tok.decode(reference[:limit])
    if variant == 1:  # EOS somewhere in the output, often inside an accepted draft
        eos = reference[rng.randrange(len(reference))]
        cut = reference.index(eos)
        return {"max_new_tokens": MAX_NEW}, eos, reference[:cut], tok.decode(reference[:cut])
    text = tok.decode(reference)
    if variant == 2:  # a two-token stop string taken from the output itself
        start = rng.randrange(len(reference) - 1)
        stop = text[start : start + 2]
        cut = text.find(stop)
        return {"max_new_tokens": MAX_NEW, "stop_strings": (stop,)}, None, reference[:cut], text[:cut]
    cut = text.find("\n")  # end of line (token NEWLINE), when the output has one
    if cut < 0:
        return {"max_new_tokens": MAX_NEW, "stop_at_newline": True}, None, reference, text
    return {"max_new_tokens": MAX_NEW, "stop_at_newline": True}, None, reference[:cut], text[:cut]


def assert_speculative_greedy_is_plain_greedy(targets, near, drafter_name: str, loaded) -> None:
    """200 prompt/stop cases: the engine on ``loaded(target, eos)`` with ``drafter_name`` (the
    draft model from ``near``) returns the target's own plain greedy decoding, drafts kept and
    rejected both."""
    proposed = accepted = 0
    for i in range(200):
        rng, prompt, variant = make_case(i)
        target = targets[i % len(targets)]
        reference = plain_greedy_pass(target, prompt, MAX_NEW)
        kwargs, eos, want_tokens, want_text = expected_output(reference, variant, rng)
        engine = SpeculativeEngine(loaded(target, eos))
        drafter = make_drafter(
            drafter_name,
            draft_model=loaded(near[i % len(near)]),
            cost=engine.cost,
            max_draft=rng.choice([2, 4, 8]),
        )
        result = engine.generate(prompt, GenerationConfig(**kwargs), drafter)
        assert result.token_ids == want_tokens, f"case {i}: {drafter_name} diverged from greedy"
        assert result.text == want_text
        for stats in result.stats.drafters.values():
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert proposed > 200 and 0 < accepted < proposed  # drafts were both kept and rejected
