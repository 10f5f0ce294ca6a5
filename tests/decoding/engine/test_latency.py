"""Latency that does not scale with the CPU's slowness (issue 40, item 6), in the engine.

A slow machine is simulated deterministically: the engine's forward is wrapped so that each pass
advances a fake clock by a set time per token fed (the engine's prefill pace reads that clock),
while the tiny model computes the real logits. Nothing here depends on how fast this CPU is.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.engine.pacing import (
    COLD_PREFILL_TOKENS,
    LONGEST_PASS_MS,
    PREFILL_PASS_MS,
    PrefillPace,
)
from speculative_complete.decoding.kv_cache import PrefixCache
from tests.support.reference import plain_greedy
from tests.support.tiny_models import loaded, tiny_model

MB = 1 << 20
AVX2_MS_PER_TOKEN = 8.6  # the default model's prefill on the AVX2-only EPYC (DESIGN.md: 4.39 s / 512)


class SlowMachine:
    """Wraps ``engine._forward``: each pass takes ``per_token_ms`` per token fed (plus
    ``per_pass_ms``) on a fake clock, which the engine's prefill pace reads; records what was fed."""

    def __init__(self, engine: SpeculativeEngine, per_token_ms: float, per_pass_ms: float = 0.0) -> None:
        self.now_ms = 0.0
        self.fed: list[int] = []
        self.during: Callable[[float, float], None] | None = None  # called with each pass's start and end
        forward = engine._forward

        def slow_forward(tokens, cache, *rest, **options):
            start = self.now_ms
            self.now_ms += per_pass_ms + per_token_ms * len(tokens)
            self.fed.append(len(tokens))
            if self.during is not None:
                self.during(start, self.now_ms)
            return forward(tokens, cache, *rest, **options)

        engine._forward = slow_forward
        engine.pace = PrefillPace(clock=lambda: self.now_ms / 1000)


@pytest.fixture(scope="module")
def target():
    return tiny_model(31, layers=2, logit_scale=8.0, max_positions=1024)


def prompt_of(length: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(64) for _ in range(length)]


@pytest.mark.parametrize("per_token_ms", [AVX2_MS_PER_TOKEN, 2.0, 0.01])
def test_prefill_passes_are_sized_by_their_measured_time(target, per_token_ms):
    """A cold engine's first pass is the safe minimum; each later one holds as many tokens as fit
    in the target time at the pace measured so far, at least the minimum (the fixed part of a
    pass is not measured yet), at most the old count. Exact whatever the passes: the tokens are
    plain greedy's."""
    engine = SpeculativeEngine(loaded(target))
    machine = SlowMachine(engine, per_token_ms)
    prompt = prompt_of(600)
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=4))
    assert result.token_ids == plain_greedy(target, prompt, 4)
    prefill = machine.fed[: len(machine.fed) - 3]  # then three one-token steps
    assert sum(prefill) == len(prompt)
    fitting = min(256, max(COLD_PREFILL_TOKENS, int(PREFILL_PASS_MS / per_token_ms)))
    assert prefill[0] == COLD_PREFILL_TOKENS
    assert all(n == fitting for n in prefill[1:-1]), prefill
    assert prefill[-1] <= fitting + COLD_PREFILL_TOKENS


# (fixed ms per pass, ms per token, tokens per pass once both are measured): the 0.5B replica on
# the AVX2 EPYC (about 20 + 8.6 per token: the target fits 3, a fixed fifth needs 10, and 10 fit in
# 250 ms); the 1.5B (30 + 20: a fixed fifth at 6 tokens); a fast machine (96 fit in 50 ms); a
# hopeless one (100 + 5: a fixed fifth needs 80 tokens, 30 fill 250 ms).
MACHINES = [(20.0, 8.6, 10), (30.0, 20.0, 6), (2.0, 0.5, 96), (100.0, 5.0, 30)]


@pytest.mark.parametrize(("per_pass_ms", "per_token_ms", "expected"), MACHINES)
def test_once_decode_steps_measure_the_fixed_part_passes_fit_it(target, per_pass_ms, per_token_ms, expected):
    """Every pass costs a fixed part (the weights read once) and a part per token. The decode steps
    of a first request measure the fixed part, so the next request's prefill passes hold as many
    tokens as fit in the target time after it, at least enough that it is at most a fifth of the
    pass while that fits in ``LONGEST_PASS_MS``, and at least half the pass whatever the machine.
    Exact whatever the passes."""
    engine = SpeculativeEngine(loaded(target))
    machine = SlowMachine(engine, per_token_ms, per_pass_ms)
    engine.generate(prompt_of(300, seed=1), GenerationConfig(max_new_tokens=8))
    assert engine.pace.fixed_ms is not None
    machine.fed.clear()
    prompt = prompt_of(300, seed=2)
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=8))
    assert result.token_ids == plain_greedy(target, prompt, 8)
    prefill = machine.fed[: len(machine.fed) - 7]
    assert sum(prefill) == len(prompt)
    settled = prefill[len(prefill) // 2 : -1]
    assert all(abs(n - expected) <= max(1, expected // 8) for n in settled), prefill
    assert measured(per_pass_ms, per_token_ms).tokens(PREFILL_PASS_MS, 256) == expected


def key_at(machine: SlowMachine, key_ms: float) -> tuple[threading.Event, list[float]]:
    """A keystroke at ``key_ms`` on the machine's clock: it sets the returned cancel event during
    the pass in flight then, and records how long it waited for that pass to end."""
    stop = threading.Event()
    waited: list[float] = []

    def keystroke(start: float, end: float) -> None:
        if start <= key_ms < end:
            stop.set()
            waited.append(end - key_ms)

    machine.during = keystroke
    return stop, waited


def test_a_cancel_waits_at_most_the_longest_pass_once_the_fixed_part_is_known(target):
    """On the 0.5B replica's pace (20 ms per pass plus 8.6 per token) a keystroke arriving in a
    warm engine's prefill waits for one warm pass (10 tokens, 106 ms), not the cold minimum's 158
    ms; what was prefilled is kept."""
    engine = SpeculativeEngine(loaded(target), prefix_cache=PrefixCache(64 * MB))
    machine = SlowMachine(engine, 8.6, per_pass_ms=20.0)
    engine.generate(prompt_of(100, seed=1), GenerationConfig(max_new_tokens=8), cache_key="e")
    stop, waited = key_at(machine, machine.now_ms + 500.0)
    before = len(machine.fed)
    prompt = prompt_of(600)
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=4), cancel=stop, cache_key="d")
    assert result.stop_reason == "cancelled"
    (wait,) = waited
    assert 0 < wait <= 20.0 + 10 * 8.6 + 1e-6 < LONGEST_PASS_MS
    prefilled = sum(machine.fed[before:])
    resumed = engine.generate(prompt, GenerationConfig(max_new_tokens=4), cache_key="d")
    assert resumed.stats.reused_tokens == prefilled
    assert resumed.token_ids == plain_greedy(target, prompt, 4)


def test_a_cancel_on_a_slow_cpu_waits_for_one_short_pass_not_a_long_one(target):
    """On the AVX2 machine's pace a newer keystroke arriving mid-prefill of a cold engine stops it
    after the pass in flight, which is the cold minimum there (the old fixed count of 256 tokens
    took ~2 s); what was prefilled is kept for the next request."""
    engine = SpeculativeEngine(loaded(target), prefix_cache=PrefixCache(64 * MB))
    machine = SlowMachine(engine, AVX2_MS_PER_TOKEN)
    stop, waited = key_at(machine, 500.0)
    prompt = prompt_of(600)
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=4), cancel=stop, cache_key="d")
    assert result.stop_reason == "cancelled"
    assert machine.fed[-1] <= COLD_PREFILL_TOKENS  # the pass in flight when the key came
    (wait,) = waited
    assert wait <= COLD_PREFILL_TOKENS * AVX2_MS_PER_TOKEN
    prefilled = sum(machine.fed)
    resumed = engine.generate(prompt, GenerationConfig(max_new_tokens=4), cache_key="d")
    assert resumed.stats.reused_tokens == prefilled
    assert resumed.token_ids == plain_greedy(target, prompt, 4)


def measured(fixed_ms: float, token_ms: float) -> PrefillPace:
    """A pace that has timed a cold pass of 16 tokens and two decode steps on such a machine."""
    pace = PrefillPace()
    pace.record(COLD_PREFILL_TOKENS, COLD_PREFILL_TOKENS * token_ms)
    pace.record(1, fixed_ms + token_ms)
    assert pace.fixed_ms is None  # one step could be a hiccup
    pace.record(1, fixed_ms + token_ms)
    return pace


def test_a_machine_getting_busier_shrinks_passes_within_three_and_one_hiccup_does_not():
    """Each estimate is the median of the last five measurements: another program starting (what a
    short cancel latency must survive) is believed after three slow passes; a single slow pass (a
    first step's allocations, a burst elsewhere) changes nothing."""
    pace = PrefillPace()
    assert pace.tokens(PREFILL_PASS_MS, 256) == COLD_PREFILL_TOKENS
    pace.record(64, 64 * 0.5)
    assert pace.tokens(PREFILL_PASS_MS, 256) == 100
    pace.record(COLD_PREFILL_TOKENS - 1, 300.0)  # its fixed part unknown, a short pass says little
    assert pace.token_ms == 0.5
    pace = measured(fixed_ms=6.0, token_ms=3.2)  # the default model on the AVX2 EPYC
    assert (pace.fixed_ms, pace.token_ms) == pytest.approx((6.0, 3.2))
    assert pace.tokens(PREFILL_PASS_MS, 256) == 13
    pace.record(1, 957.0)  # a first step after a load
    pace.record(13, 6.0 + 13 * 40.0)
    pace.record(2, 6.0 + 2 * 60.0)  # a few rows' kernels: not a token's part
    assert pace.tokens(PREFILL_PASS_MS, 256) == 13
    for _ in range(3):
        pace.record(1, 3 * (6.0 + 3.2))
        pace.record(13, 3 * (6.0 + 13 * 3.2))
    assert (pace.fixed_ms, pace.token_ms) == pytest.approx((3 * 6.0, 3 * 3.2), rel=0.02)
    assert pace.tokens(PREFILL_PASS_MS, 256) == 8  # a fixed fifth: 8 tokens (13 before)


def test_fixed_passes_where_asked(target):
    """``prefill_ms=None`` keeps passes of ``prefill_chunk`` tokens (a benchmark's one-pass prefill)."""
    engine = SpeculativeEngine(loaded(target))
    machine = SlowMachine(engine, AVX2_MS_PER_TOKEN)
    engine.generate(
        prompt_of(600), GenerationConfig(max_new_tokens=1, prefill_chunk=1 << 20, prefill_ms=None)
    )
    assert machine.fed == [600]


@pytest.fixture(scope="module")
def liner():
    """A tiny model whose greedy output after ``LINES_PROMPT`` is lines of seven tokens (token
    10 is the tiny tokenizer's line end), then ``LINES_PROMPT`` and that output."""
    model = tiny_model(0, layers=2, logit_scale=8.0)
    rng = random.Random(0)
    prompt = [rng.choice([10, 3, 4, 5, 6, 7]) for _ in range(30)]
    truth = plain_greedy(model, prompt, 48)
    assert [i for i, t in enumerate(truth[:26]) if t == 10] == [11, 18, 25]
    return model, prompt, truth


@pytest.mark.parametrize(("due_after_passes", "lines", "answered_ms"), [(21, 2, 2100.0), (1, 1, 1200.0)])
def test_a_due_answer_is_the_whole_lines_ready_and_the_rest_stays_on_the_chain(
    liner, due_after_passes: int, lines: int, answered_ms: float
):
    """When the first answer is due (a pass takes 100 ms here, the answer is due halfway through
    a pass), a multi-line generation ends after its last whole line, never inside one, and no
    pass that would end past the due time is started: two lines when 21 tokens are decoded by
    then, else the first line as soon as it is whole. Every token decoded stays on the
    document's greedy chain, and the next request at the same place goes on from it, token for
    token plain greedy."""
    model, prompt, truth = liner
    engine = SpeculativeEngine(loaded(model), prefix_cache=PrefixCache(64 * MB))
    machine = SlowMachine(engine, per_token_ms=0.0, per_pass_ms=100.0)
    due_ms = 100.0 * due_after_passes + 50.0

    def due(next_pass_ms: float) -> bool:
        return machine.now_ms + next_pass_ms >= due_ms

    # the prompt in one pass, so that the passes counted are the decode's (pacing is tested above)
    config = GenerationConfig(max_new_tokens=48, answer_due=due, prefill_ms=None)
    result = engine.generate(prompt, config, cache_key="d")
    line_ends = [11, 18, 25]
    kept = line_ends[lines - 1]
    assert result.stop_reason == "partial"
    assert machine.now_ms == answered_ms
    assert result.token_ids == truth[:kept]
    assert result.text == engine.decode(truth[:kept]) and not result.text.endswith("\n")
    decoded = max(due_after_passes, kept + 1)  # the line end itself is decoded before it is cut at
    assert engine.prefix_cache.chain("d").tokens == prompt + truth[:decoded]
    rest = engine.generate(prompt, GenerationConfig(max_new_tokens=48), cache_key="d")
    assert rest.token_ids == truth
    assert rest.stats.known_tokens == decoded


def test_a_decode_going_on_from_the_chain_expects_its_next_pass_to_take_a_step(liner):
    """A request at the same place after a partial answer makes no prefill pass (the chain's
    tokens are known), so each of its passes is a step: with 100 ms steps and the answer due
    350 ms in, the third step is started (it ends at 300 ms). Counting a prefill that never ran
    expects 200 ms after the second step and answers a step early."""
    model, prompt, truth = liner
    engine = SpeculativeEngine(loaded(model), prefix_cache=PrefixCache(64 * MB))
    machine = SlowMachine(engine, per_token_ms=0.0, per_pass_ms=100.0)
    first = GenerationConfig(
        max_new_tokens=48, answer_due=lambda _ms: machine.now_ms >= 1150.0, prefill_ms=None
    )
    assert engine.generate(prompt, first, cache_key="d").token_ids == truth[:11]
    known = len(engine.prefix_cache.chain("d").tokens) - len(prompt)
    assert known == 12
    started_ms = machine.now_ms

    def due(next_pass_ms: float) -> bool:
        return machine.now_ms + next_pass_ms >= started_ms + 350.0

    result = engine.generate(prompt, GenerationConfig(max_new_tokens=48, answer_due=due), cache_key="d")
    assert machine.now_ms - started_ms == 300.0
    assert result.stop_reason == "partial" and result.token_ids == truth[:11]
    assert result.stats.known_tokens == known and result.stats.after_prefill == (3, 3)
    assert engine.prefix_cache.chain("d").tokens == prompt + truth[: known + 3]


def test_an_answer_not_due_waits_for_the_generation_to_end(liner):
    model, prompt, truth = liner
    engine = SpeculativeEngine(loaded(model))
    result = engine.generate(prompt, GenerationConfig(max_new_tokens=48, answer_due=lambda _ms: False))
    assert result.stop_reason == "max_tokens" and result.token_ids == truth
