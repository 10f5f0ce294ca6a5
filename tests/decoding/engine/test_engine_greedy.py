"""Greedy speculative decoding returns exactly the target's own greedy output, for every drafter.

Tiny seeded random models stand in for the real one: mechanics (acceptance, cache roll-back,
stops inside drafts, EOS inside drafts, the token limit inside drafts) do not depend on weights.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from speculative_complete.decoding.corpus_index import CorpusIndex
from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.drafter_interface import Draft, Drafter
from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from tests.support.greedy_cases import MAX_NEW, expected_output, make_case, perturbed_copy
from tests.support.reference import plain_greedy
from tests.support.tiny_models import TINY_VOCAB, TinyTokenizer, loaded, tiny_model

NEWLINE = TinyTokenizer().newline_id


@pytest.fixture(scope="module")
def targets():
    # Sharper logits give repetitive greedy text (n-gram matches); flatter ones give little repetition.
    return [
        tiny_model(seed, layers=2, logit_scale=scale)
        for seed, scale in [(11, 1.0), (12, 8.0), (13, 20.0), (14, 40.0)]
    ]


@pytest.fixture(scope="module")
def drafts(targets):
    near = [perturbed_copy(t, i, 0.3) for i, t in enumerate(targets)]
    other = [tiny_model(100 + i, layers=1, logit_scale=10.0) for i in range(len(targets))]
    return near, other


def corpus_documents(rng: random.Random, prompt: list[int], reference: list[int]) -> list[list[int]]:
    """A workspace for the case: the prompt's tail and the target's own continuation with one
    token changed somewhere (drafts accepted up to there, rejected there), and unrelated text."""
    tail = prompt[-rng.randint(1, len(prompt)) :]
    copy = tail + list(reference)
    wrong = rng.randrange(len(tail), len(copy)) if reference else 0
    copy[wrong] = (copy[wrong] + 1) % TINY_VOCAB
    noise = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(0, 60))]
    return [copy, noise]


def make_case_drafter(name: str, engine, draft_model, max_draft: int, corpus: list[list[int]]):
    """``corpus``: the n-gram drafter with the case's workspace as its corpus index."""
    if name != "corpus":
        return make_drafter(name, draft_model=draft_model, cost=engine.cost, max_draft=max_draft)
    drafter = make_drafter("ngram", cost=engine.cost, max_draft=max_draft)
    drafter.corpus = CorpusIndex(corpus)
    return drafter


def run_cases(targets, drafts, drafter_name: str, cases: range) -> dict[str, int]:
    near, other = drafts
    totals = {"proposed": 0, "accepted": 0, "passes": 0, "tokens": 0, "corpus_drafts": 0}
    for i in cases:
        rng, prompt, variant = make_case(i)
        which = i % len(targets)
        target = targets[which]
        reference = plain_greedy(target, prompt, MAX_NEW)
        kwargs, eos, want_tokens, want_text = expected_output(reference, variant, rng)
        target.config.eos_token_id = eos
        try:
            engine = SpeculativeEngine(loaded(target))
            draft_model = loaded(near[which] if i % 3 else other[which])
            corpus = corpus_documents(random.Random(f"corpus:{i}"), prompt, reference)
            drafter = make_case_drafter(drafter_name, engine, draft_model, rng.choice([2, 4, 8]), corpus)
            result = engine.generate(prompt, GenerationConfig(**kwargs), drafter)
        finally:
            target.config.eos_token_id = None
        assert result.token_ids == want_tokens, f"case {i}: {drafter_name} diverged from greedy"
        assert result.text == want_text, f"case {i}"
        for stats in result.stats.drafters.values():
            totals["proposed"] += stats.proposed
            totals["accepted"] += stats.accepted
        totals["passes"] += result.stats.target_passes
        totals["tokens"] += result.stats.produced_tokens
        counts = getattr(drafter, "corpus_counts", None)
        totals["corpus_drafts"] += counts.drafts if counts is not None else 0
    return totals


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "model", "auto", "corpus"])
def test_greedy_output_equals_plain_greedy_on_200_cases(targets, drafts, drafter_name):
    totals = run_cases(targets, drafts, drafter_name, range(200))
    if drafter_name == "none":
        assert totals["passes"] == totals["tokens"]
    else:
        # The drafter really drafted, and drafts were both accepted and rejected.
        assert totals["proposed"] > 200
        assert 0 < totals["accepted"] < totals["proposed"]
        assert totals["tokens"] > totals["passes"]
    if drafter_name == "corpus":  # the workspace's index drafted, not only the prompt
        assert totals["corpus_drafts"] > 100


class RejectAt(Drafter):
    """Proposes the target's true continuation with the token at ``wrong`` replaced."""

    name = "scripted"

    def __init__(self, truth: list[int], prompt_len: int, wrong: int | None, length: int) -> None:
        self.truth, self.prompt_len, self.wrong, self.length = truth, prompt_len, wrong, length
        self.accepted: list[int] = []

    def begin(self, prompt, sampling, generator, session=None) -> None:
        pass

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        done = len(tokens) - self.prompt_len
        draft = self.truth[done : done + min(self.length, max_len)]
        if self.wrong is not None and self.wrong < len(draft):
            draft = list(draft)
            draft[self.wrong] = (draft[self.wrong] + 1) % TINY_VOCAB
        return Draft(tokens=list(draft), source=self.name)

    def observe(self, draft: Draft, accepted: int) -> None:
        self.accepted.append(accepted)


@pytest.mark.parametrize("wrong", [None, 0, 1, 2, 3, 4, 5])
def test_rejection_at_every_position_keeps_the_output_exact(targets, wrong):
    target = targets[1]
    for seed in range(5):
        prompt = [random.Random(seed).randrange(TINY_VOCAB) for _ in range(5)]
        truth = plain_greedy(target, prompt, 30)
        drafter = RejectAt(truth + [0] * 8, len(prompt), wrong, length=6)
        engine = SpeculativeEngine(loaded(target))
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=30), drafter)
        assert result.token_ids == truth
        full_drafts = drafter.accepted[:-1]  # the last draft may be cut short by the token limit
        assert all(a == (6 if wrong is None else wrong) for a in full_drafts), drafter.accepted


def record_fed_lengths(engine: SpeculativeEngine) -> list[int]:
    """How many tokens each target pass of ``engine`` is fed, in order (the list fills as it runs)."""
    fed: list[int] = []
    forward = engine._forward

    def recording_forward(tokens, cache, *rest, **options):
        fed.append(len(tokens))
        return forward(tokens, cache, *rest, **options)

    engine._forward = recording_forward
    return fed


@pytest.mark.parametrize("wrong", [None, 0, 3])
def test_the_first_draft_is_verified_inside_the_prefill_pass(targets, wrong):
    """A right draft after the prompt comes out of the prefill: one pass for a whole line; a
    wrong one is cropped from the cache and the rest decodes exactly as plain greedy."""
    target = targets[2]
    prompt = [random.Random(21).randrange(TINY_VOCAB) for _ in range(40)]
    truth = plain_greedy(target, prompt, 7)
    drafter = RejectAt(truth + [0] * 8, len(prompt), wrong, length=6)
    engine = SpeculativeEngine(loaded(target))
    fed = record_fed_lengths(engine)
    result = engine.generate(
        prompt, GenerationConfig(max_new_tokens=7, prefill_chunk=256, prefill_ms=None), drafter
    )
    assert result.token_ids == truth
    assert fed[0] == len(prompt) + 6  # the prompt and the draft in one pass
    assert drafter.accepted[0] == (6 if wrong is None else wrong)
    if wrong is None:
        assert result.stats.target_passes == 1 and len(fed) == 1
    assert result.stats.drafters["scripted"].proposed >= 6


def test_a_draft_is_verified_only_up_to_the_token_that_ends_the_line(targets):
    """With ``stop_at_newline`` a drafted newline (or any token after it) would buy a row whose
    answer the pass's row before it gives anyway: a deterministic draft is cut before it, the
    output exactly plain greedy's. A sampled draft is not cut by its tokens' values (that would
    bias what is drawn): it is verified whole, its rows past the line's end discarded as before."""
    target = targets[2]
    prompt = [random.Random(23).randrange(TINY_VOCAB) for _ in range(30)]
    truth = plain_greedy(target, prompt, 8)
    engine = SpeculativeEngine(loaded(target))
    fed = record_fed_lengths(engine)
    one_pass = {"prefill_chunk": 256, "prefill_ms": None}
    draft = [NEWLINE if i == 2 else t for i, t in enumerate(truth[:6])]  # a line's end 3rd
    drafter = RejectAt(draft + [0] * 8, len(prompt), None, length=6)
    config = GenerationConfig(max_new_tokens=8, stop_at_newline=True, **one_pass)
    result = engine.generate(prompt, config, drafter)
    assert fed[0] == len(prompt) + 2  # the two tokens before the newline
    assert result.text == engine.decode(truth).split("\n")[0]
    fed.clear()
    sampled = GenerationConfig(max_new_tokens=8, stop_at_newline=True, temperature=0.8, seed=1, **one_pass)
    engine.generate(prompt, sampled, OneHotDrafts(draft))
    assert fed[0] == len(prompt) + 6


class OneHotDrafts(RejectAt):
    """``RejectAt``'s tokens as a sampled draft, each drawn from a one-hot row."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__(tokens, 0, None, len(tokens))

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        drafted = self.truth[: min(self.length, max_len)]
        return Draft(
            list(drafted), torch.nn.functional.one_hot(torch.tensor(drafted), TINY_VOCAB).float(), self.name
        )


def test_a_greedy_draft_rides_on_the_prefill_while_healing_owes_text(targets):
    """Greedy: the draft is verified in the prefill pass, each row masked for the text still owed
    (``Healing``); sampled: no draft until the text is written (cutting a sampled draft where the
    constraint refuses it would change what is drawn)."""
    target = targets[2]
    engine = SpeculativeEngine(loaded(target))
    prompt = [random.Random(22).randrange(TINY_VOCAB) for _ in range(20)]
    truth = plain_greedy(target, prompt, 6)
    required = engine.decode(truth[:1])
    drafter = RejectAt(truth + [0] * 8, len(prompt), None, length=4)
    fed = record_fed_lengths(engine)
    one_pass = {"prefill_chunk": 256, "prefill_ms": None}  # the prompt in one pass: fed[0] is all of it
    config = GenerationConfig(max_new_tokens=6, required_prefix=required, **one_pass)
    result = engine.generate(prompt, config, drafter)
    assert fed[0] == len(prompt) + 4
    assert result.token_ids == truth
    fed.clear()
    sampled = GenerationConfig(
        max_new_tokens=6, required_prefix=required, temperature=0.8, seed=1, **one_pass
    )
    engine.generate(prompt, sampled, drafter)
    assert fed[0] == len(prompt)


def test_a_weak_ngram_match_rides_on_the_prefill_but_does_not_buy_a_decode_pass(targets):
    """A 1-token n-gram match is accepted ~15% of the time: not worth a decode pass of its own,
    but worth one more row of the prefill pass, which runs anyway."""
    target = targets[2]
    prompt = list(range(40)) + [7]  # the last token occurred once before: a 1-token match
    # Priced as on a CPU where a decode pass over 2 tokens costs 1.8 single-token steps.
    cost = CostModel(prior={1: 1.0, 2: 1.8, 4: 1.5, 8: 1.4, 16: 1.7, 32: 2.8, 256: 8.4, 512: 17.2})
    engine = SpeculativeEngine(loaded(target), cost=cost)
    auto = make_drafter("auto", cost=engine.cost)
    fed = record_fed_lengths(engine)
    result = engine.generate(
        prompt, GenerationConfig(max_new_tokens=2, prefill_chunk=256, prefill_ms=None), auto
    )
    assert fed[0] == len(prompt) + 1  # the prompt and the 1-token draft [8]
    assert result.token_ids == plain_greedy(target, prompt, 2)
    auto.begin(prompt, GenerationConfig().sampling, None)
    assert len(auto.propose(prompt, 16)) == 0  # the same match between decode steps: no draft
