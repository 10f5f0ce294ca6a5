"""A draft model whose output layer is another size than the target's, through the real engine.

Real pairs differ there: Qwen2.5-Coder 0.5B has 151936 outputs and 7B, which it drafts for in
llama.cpp's presets, has 152064, both over one tokenizer of 151665 tokens. Tiny models of
``TOKENIZER`` tokens with ``SMALL`` and ``LARGE`` outputs stand in for them, the draft once the
larger and once the smaller. The rows past the tokenizer are random here (trained models give
them little mass), so the target writes ids the smaller draft has no row for and the larger
draft proposes ids the smaller target has no row for: both must be bridged, not only avoided.
"""

from __future__ import annotations

import random

import pytest

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.models.loading import ModelLoadError, check_draft_compatible
from speculative_complete.decoding.verify import SamplingParams
from tests.support.reference import plain_greedy
from tests.support.sampling import PROMPT, SAMPLES, chi_square_pvalue, exact_joint
from tests.support.tiny_models import TINY_VOCAB, TinyTokenizer, loaded, tiny_model

TOKENIZER = TINY_VOCAB - 4  # ids every model of the pair has
SMALL, LARGE = TINY_VOCAB, TINY_VOCAB + 8
PAIRS = [pytest.param(SMALL, LARGE, id="draft-larger"), pytest.param(LARGE, SMALL, id="draft-smaller")]
CASES = 60


def pair(target_vocab: int, draft_vocab: int, scale: float) -> tuple:
    """The raw target and draft of the given output sizes (for reference decoding), and both as
    ``LoadedModel``s over one tokenizer."""
    tokenizer = TinyTokenizer(TOKENIZER)
    target = tiny_model(31, layers=2, vocab_size=target_vocab, logit_scale=scale)
    draft = tiny_model(32, layers=1, vocab_size=draft_vocab, logit_scale=scale)
    return target, draft, loaded(target, tokenizer), loaded(draft, tokenizer)


@pytest.mark.parametrize("target_vocab,draft_vocab", PAIRS)
def test_the_pair_is_accepted_and_greedy_output_is_the_targets_own(target_vocab, draft_vocab):
    """Every case gives the target's own greedy tokens; some drafts are accepted, and ids only the
    larger model has occur (the target writes them, or the draft alone would choose them), so the
    bridge is exercised, not skirted."""
    raw, raw_draft, target, draft = pair(target_vocab, draft_vocab, scale=6.0)
    check_draft_compatible(target, draft)
    engine = SpeculativeEngine(target)
    accepted = beyond = 0
    for i in range(CASES):
        rng = random.Random(i)
        prompt = [rng.randrange(target_vocab) for _ in range(rng.randint(1, 12))]
        drafter = make_drafter(
            rng.choice(["model", "auto"]),
            draft_model=draft,
            cost=engine.cost,
            max_draft=rng.choice([2, 4, 8]),
            target_vocab=target.vocab_size,
        )
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=24), drafter)
        want = plain_greedy(raw, prompt, 24)
        assert result.token_ids == want, f"case {i}"
        accepted += sum(s.accepted for s in result.stats.drafters.values())
        if draft_vocab < target_vocab:  # ids the target writes that the draft has no row for
            beyond += sum(t >= draft_vocab for t in prompt + want)
        else:  # ids the draft alone would choose that the target has no row for
            beyond += sum(t >= target_vocab for t in plain_greedy(raw_draft, prompt, 8))
    assert accepted > CASES and beyond > 0


@pytest.mark.parametrize("target_vocab,draft_vocab", PAIRS)
def test_sampling_keeps_the_targets_distribution(target_vocab, draft_vocab):
    """The first two tokens' joint distribution, as in ``test_engine_sampling``: the draft's q
    rows are the target's width (the rows the draft lacks have probability 0)."""
    raw, _, target, draft = pair(target_vocab, draft_vocab, scale=3.0)
    params = SamplingParams(temperature=1.0, top_k=6)
    joint = exact_joint(raw, PROMPT, params, depth=2)
    engine = SpeculativeEngine(target)
    drafter = make_drafter(
        "model", draft_model=draft, cost=engine.cost, max_draft=3, target_vocab=target.vocab_size
    )
    config = GenerationConfig(max_new_tokens=4, temperature=1.0, top_k=6)
    counts: dict[tuple[int, ...], int] = {}
    proposed = accepted = 0
    for seed in range(SAMPLES):
        config.seed = seed
        result = engine.generate(PROMPT, config, drafter)
        key = tuple(result.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        proposed += sum(s.proposed for s in result.stats.drafters.values())
        accepted += sum(s.accepted for s in result.stats.drafters.values())
    assert chi_square_pvalue(counts, joint) > 0.001
    assert proposed > SAMPLES // 2 and 0 < accepted < proposed


def test_a_draft_that_lacks_tokenizer_ids_is_refused_unless_it_is_the_targets_size():
    """The rule: the draft's outputs cover every id of the tokenizer (then any difference in size
    from the target's is bridged by the drafter), or are exactly the target's."""
    tokenizer = TinyTokenizer(TOKENIZER)
    target = loaded(tiny_model(31, vocab_size=LARGE), tokenizer)
    short = loaded(tiny_model(32, vocab_size=TOKENIZER - 1), tokenizer)
    with pytest.raises(ModelLoadError, match="output size"):
        check_draft_compatible(target, short)
    short_target = loaded(tiny_model(31, vocab_size=TOKENIZER - 1), tokenizer)
    check_draft_compatible(short_target, short)
