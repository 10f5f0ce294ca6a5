"""transformers' generate() as a peer decoding path: the same tokens and stops as the engine."""

from __future__ import annotations

import random

import pytest

from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.engine.transformers_peer import TransformersDecoder
from tests.support.tiny_models import TINY_VOCAB, TinyTokenizer, loaded, tiny_model

NEWLINE = TinyTokenizer().newline_id


@pytest.fixture(scope="module")
def engine():
    return SpeculativeEngine(loaded(tiny_model(31, logit_scale=20.0)))


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "model"])
def test_generate_gives_the_engines_tokens_text_and_stops(engine, drafter_name):
    peer = TransformersDecoder(engine, loaded(tiny_model(32, layers=1)))
    for seed in range(6):
        rng = random.Random(seed)
        prompt = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 12))] * 2
        for config in (
            GenerationConfig(max_new_tokens=12),
            GenerationConfig(max_new_tokens=30, stop_at_newline=True),
        ):
            want = engine.generate(prompt, config)
            got = peer.generate(prompt, config, drafter_name)
            assert (got.token_ids, got.text, got.stop_reason) == (want.token_ids, want.text, want.stop_reason)
            assert got.stats.target_passes >= 1


def test_a_cancel_stops_generate_and_is_reported(engine):
    peer = TransformersDecoder(engine)
    calls = {"n": 0}

    def cancel_after_three_steps() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    config = GenerationConfig(max_new_tokens=50)
    result = peer.generate(list(range(10)), config, "ngram", cancel_after_three_steps)
    assert result.stop_reason == "cancelled" and len(result.token_ids) < 50
