"""Cancellation, context trimming and odd prompts."""

from __future__ import annotations

import threading

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from tests.support.reference import plain_greedy
from tests.support.tiny_models import loaded, tiny_model


def test_cancel_takes_effect_within_one_step_and_returns_the_prefix():
    target = tiny_model(5, logit_scale=10.0)
    engine = SpeculativeEngine(loaded(target))
    prompt = [3, 4, 5, 3, 4]
    truth = plain_greedy(target, prompt, 60)
    for allowed in (1, 2, 5, 9):
        polls = 0

        def cancel(allowed=allowed) -> bool:
            nonlocal polls
            polls += 1
            return polls > allowed

        polls = 0
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=60), make_drafter("ngram"), cancel)
        assert result.stop_reason == "cancelled"
        assert result.stats.target_passes == allowed  # no pass started after the cancel was seen
        assert result.token_ids == truth[: len(result.token_ids)] and len(result.token_ids) >= allowed


def test_an_event_set_from_another_thread_stops_a_running_generation():
    target = tiny_model(6, layers=2, logit_scale=10.0, max_positions=4096)
    engine = SpeculativeEngine(loaded(target))
    event = threading.Event()
    calls = 0
    forward = engine._forward

    def counting_forward(tokens, cache, *rest, **options):
        nonlocal calls
        calls += 1
        if calls == 10:  # the user typed on while decoding
            threading.Thread(target=event.set).start()
        return forward(tokens, cache, *rest, **options)

    engine._forward = counting_forward
    result = engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=3000), None, event)
    assert result.stop_reason == "cancelled"
    assert 10 <= result.stats.target_passes <= 12
    assert event.is_set() and len(result.token_ids) == result.stats.target_passes


def test_prompt_longer_than_the_context_is_trimmed_from_the_left(caplog):
    target = tiny_model(7, max_positions=64)
    engine = SpeculativeEngine(loaded(target))
    prompt = [i % 50 for i in range(300)]
    config = GenerationConfig(max_new_tokens=8, max_draft_tokens=4)
    with caplog.at_level("WARNING"):
        result = engine.generate(prompt, config, make_drafter("auto"))
    room = 64 - 8 - 4 - 1
    assert result.stats.trimmed_tokens == 300 - room and result.stats.prompt_tokens == room
    assert "exceeds the context" in caplog.text
    assert result.token_ids == plain_greedy(target, prompt[-room:], 8)


def test_empty_prompt_and_zero_budget_answer_without_error():
    target = tiny_model(8)
    engine = SpeculativeEngine(loaded(target))
    result = engine.generate([], GenerationConfig(max_new_tokens=5), make_drafter("ngram"))
    assert len(result.token_ids) == 5 and result.stop_reason == "max_tokens"
    result = engine.generate([1, 2], GenerationConfig(max_new_tokens=0))
    assert result.token_ids == [] and result.stats.target_passes == 0


def test_stats_report_passes_drafts_and_timings():
    target = tiny_model(9, logit_scale=30.0)
    engine = SpeculativeEngine(loaded(target))
    prompt = [1, 2, 3, 4] * 4
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=30), make_drafter("ngram"))
    stats = result.stats.to_dict()
    assert stats["prompt_tokens"] == 16 and stats["new_tokens"] == 30
    assert stats["target_passes"] == result.stats.target_passes < 30
    assert stats["tokens_per_pass"] > 1.0
    ngram = stats["drafters"]["ngram"]
    assert ngram["proposed"] >= ngram["accepted"] > 0 and 0 < ngram["acceptance"] <= 1
    assert stats["prefill_ms"] > 0 and stats["decode_ms"] > 0
    # what came after the prefill is the drafters' own figure
    assert 1 <= stats["prefill_tokens"] <= 30
    assert result.stats.after_prefill == (30 - stats["prefill_tokens"], stats["target_passes"] - 1)
    plain = engine.generate(prompt, GenerationConfig(max_new_tokens=30)).stats
    assert plain.prefill_tokens == 1 and plain.after_prefill == (29, 29)
