"""Drafters on their own: the n-gram index, the draft model's cache roll-back, auto's gating."""

from __future__ import annotations

import pytest
import torch

from speculative_complete.decoding.cost_model import CostModel, timed_ema
from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.drafters.auto import AutoDrafter
from speculative_complete.decoding.drafters.length import best_draft_length, expected_tokens
from speculative_complete.decoding.drafters.model import ModelDrafter
from speculative_complete.decoding.drafters.ngram import NgramDrafter, TokenIndex
from speculative_complete.decoding.verify import SamplingParams
from tests.support.reference import next_token_logits
from tests.support.tiny_models import loaded, tiny_model

GREEDY = SamplingParams()


def test_token_index_extends_incrementally_and_rebuilds_on_divergence():
    index = TokenIndex([1, 2, 3], min_n=1, max_n=3)
    index.extend([1, 2, 4])
    assert index.continuation((1, 2), 5) == [4]  # the most recent occurrence wins
    assert index.continuation((1, 2), 5, before=3) == [3, 1, 2, 4]
    positions_before = dict(index._positions)
    index.sync([1, 2, 3, 1, 2, 4, 9])  # growth: only the new token is indexed
    assert all(index._positions[k][: len(v)] == v for k, v in positions_before.items())
    assert index.continuation((4,), 3) == [9]
    index.sync([7, 7, 8])  # divergence: rebuilt from scratch
    assert index.tokens == [7, 7, 8] and index.continuation((1, 2), 3) == []


def test_ngram_prefers_the_longest_then_the_most_recent_match_across_sources():
    drafter = NgramDrafter(min_n=1, max_n=4, max_draft=4)
    drafter.set_source("other.py", [50, 1, 2, 3, 60, 61])
    live = [9, 3, 70, 71, 8, 2, 3, 80, 81, 1, 2, 3]
    drafter.begin(live, GREEDY, None)
    match = drafter.lookup(live, 4)
    assert match.source == "doc:other.py" and match.length == 3 and match.tokens == [60, 61]
    drafter.remove_source("other.py")
    match = drafter.lookup(live, 4)
    # (2, 3) occurs twice in the live sequence; the later one is followed by 80, 81.
    assert match.source == "live" and match.length == 2 and match.tokens == [80, 81, 1, 2]
    drafter.add_accepted([5, 1, 2, 3, 90])
    assert drafter.lookup(live, 4).tokens == [90]
    assert drafter.lookup([42], 4) is None


def test_ngram_index_follows_a_growing_sequence_without_rescanning():
    drafter = NgramDrafter()
    seq = [1, 2, 3, 4, 1, 2]
    drafter.begin(seq, GREEDY, None)
    assert drafter.propose(seq, 8).tokens[:2] == [3, 4]
    seq = seq + [3, 4, 1]
    live_before = drafter._live
    drafter.propose(seq, 8)
    assert drafter._live is live_before and drafter._live.tokens == seq


def test_draft_model_cache_rolls_back_to_the_accepted_prefix():
    model = loaded(tiny_model(3, layers=1, logit_scale=5.0))
    drafter = ModelDrafter(model, max_draft=6)
    drafter.begin([1, 2, 3], GREEDY, None)
    prompt = [1, 2, 3, 4, 5]
    first = drafter.propose_exactly(prompt, 5)
    assert len(first.tokens) == 5
    assert drafter.cached_tokens() == prompt + first.tokens[:-1]
    # The target kept two draft tokens and then chose its own token 63.
    sequence = prompt + first.tokens[:2] + [63]
    second = drafter.propose_exactly(sequence, 3)
    assert drafter.cached_tokens() == sequence + second.tokens[:-1]
    assert drafter._cache.get_seq_length() == len(drafter.cached_tokens())
    # Drafting from a rolled-back cache equals drafting from scratch (uncached reference).
    expected, context = [], list(sequence)
    for _ in range(3):
        token = int(next_token_logits(model.model, context).argmax())
        expected.append(token)
        context.append(token)
    assert second.tokens == expected


def greedy_continuation(model, context: list[int], count: int) -> list[int]:
    """The draft model's greedy tokens after ``context`` from scratch (uncached reference)."""
    context, out = list(context), []
    for _ in range(count):
        out.append(int(next_token_logits(model.model, context).argmax()))
        context.append(out[-1])
    return out


def test_a_draft_model_reads_a_cold_prompt_only_as_far_as_its_window():
    model = loaded(tiny_model(3, layers=1, logit_scale=5.0))
    drafter = ModelDrafter(model, max_draft=6, window=8)
    prompt = list(range(1, 30))
    drafter.begin(prompt, GREEDY, None)
    assert drafter.tokens_behind(prompt) == 8
    first = drafter.propose_exactly(prompt, 3)
    assert drafter.cached_tokens() == prompt[-8:] + first.tokens[:-1]
    assert first.tokens == greedy_continuation(model, prompt[-8:], 3)
    # The target kept one draft token (fed while drafting) and chose 63: only 63 is fed.
    sequence = prompt + first.tokens[:1] + [63]
    assert drafter.tokens_behind(sequence) == 1
    second = drafter.propose_exactly(sequence, 3)
    assert drafter.cached_tokens() == sequence[-10:] + second.tokens[:-1]
    assert second.tokens == greedy_continuation(model, sequence[-10:], 3)
    # A change inside the window rolls back to it; a jump past the window starts a fresh one.
    assert drafter.tokens_behind(prompt[:-3] + [7, 7, 7]) == 3
    assert drafter.tokens_behind(prompt + list(range(40, 60))) == 8
    far = prompt + list(range(40, 60))
    third = drafter.propose_exactly(far, 2)
    assert drafter.cached_tokens() == far[-8:] + third.tokens[:-1]


def test_sampled_drafts_carry_the_distribution_they_were_drawn_from():
    model = loaded(tiny_model(4, layers=1))
    drafter = ModelDrafter(model)
    params = SamplingParams(temperature=0.9, top_k=5)
    drafter.begin([1, 2], params, torch.Generator().manual_seed(0))
    draft = drafter.propose_exactly([1, 2], 3)
    assert draft.probs is not None and draft.probs.shape == (3, model.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens))
    assert ((draft.probs > 0).sum(-1) == 5).all()  # top-k applied to q as to p


def test_a_draft_model_drafts_only_as_far_as_its_confidence_pays():
    """Each token is weighed before it is drawn: the chance that it and those before it are kept
    against the wider verify pass and the draft step that would give it."""
    model = loaded(tiny_model(3, layers=1, logit_scale=50.0))  # its first tokens 0.95 sure or more
    prompt = [1, 2, 3, 4, 5]
    drafter = ModelDrafter(model, max_draft=6)
    drafter.begin(prompt, GREEDY, None)
    everything = drafter.propose_exactly(prompt, 6).tokens
    assert everything == greedy_continuation(model, prompt, 6)
    drafter.cost = CostModel(prior={1: 1.0, 64: 1.0}, measured_ms={1: 60.0})  # verifying is free
    drafter.step_ms = 1e-30  # and so is drafting: every token pays
    assert drafter.propose_exactly(prompt, 6, confident=True).tokens == everything
    drafter.step_ms = 60.0  # a draft step as dear as the target's: only the first token pays
    assert drafter.propose_exactly(prompt, 6, confident=True).tokens == everything[:1]
    drafter.cost = CostModel(prior={1: 1.0, 2: 2.0, 64: 64.0}, measured_ms={1: 60.0})  # a row, a step
    assert drafter.propose_exactly(prompt, 6, confident=True).tokens == []
    drafter.cost = CostModel(prior={1: 1.0, 2: 1.1, 3: 1.2, 64: 7.3}, measured_ms={1: 60.0})
    drafter.step_ms = 20.0  # in between: a prefix of the model's own tokens
    sure = drafter.propose_exactly(prompt, 6, confident=True).tokens
    assert len(sure) >= 3 and sure == everything[: len(sure)]
    unsure = ModelDrafter(loaded(tiny_model(3, layers=1)), max_draft=6, cost=drafter.cost)  # ~0.02 sure
    unsure.begin(prompt, GREEDY, None)
    unsure.step_ms = 20.0
    assert unsure.propose_exactly(prompt, 6, confident=True).tokens == []
    # Sampled: the length is decided before each draw, and each drawn token carries its q.
    drafter.begin(prompt, SamplingParams(temperature=0.9), torch.Generator().manual_seed(0))
    drafter.step_ms = 1e-30
    drafter.cost = CostModel(prior={1: 1.0, 64: 1.0}, measured_ms={1: 60.0})
    sampled = drafter.propose_exactly(prompt, 4, confident=True)
    assert len(sampled) == 4 and sampled.probs is not None and sampled.probs.shape[0] == 4


def test_a_width_is_priced_between_the_timed_ones_and_moved_not_set_by_its_first_time():
    """A width priced too high (by a prior, or by one slow pass) would keep drafts from ever
    timing it again."""
    cost = CostModel(prior={1: 1.0, 4: 1.37, 5: 2.0, 8: 2.16, 9: 2.85})
    assert cost.relative(5) == 2.0
    cost.measured_ms.update({1: 50.0, 4: 62.0, 8: 75.0})
    assert cost.relative(6) == pytest.approx((62.0 + 13.0 / 2) / 50.0)
    assert cost.relative(4) == pytest.approx(62.0 / 50.0)  # timed: as timed
    assert cost.relative(9) == 2.85  # past the widest timed width: the prior
    assert cost.added_row(0) == pytest.approx(cost.relative(2) - 1.0)  # the first row past a step
    assert cost.added_row(4) == pytest.approx(cost.relative(6) - cost.relative(5))
    cheap = CostModel(prior={1: 1.0, 3: 1.05, 8: 2.0}, measured_ms={1: 50.0, 2: 60.0, 4: 70.0})
    assert cheap.relative(3) == pytest.approx(1.05)  # a prior below the line stays
    busy = CostModel(prior={1: 1.0, 2: 1.1, 8: 1.6})
    busy.record(1, 50.0)
    busy.record(2, 100.0)  # one slow pass of two rows: counted as 1.5 times its price
    assert busy.relative(2) == pytest.approx(1.1 * (1.0 + 0.2 * 0.5))
    busy.record(2, 500.0)  # however slow
    assert busy.relative(2) == pytest.approx(1.1 * 1.1 * 1.1)
    for _ in range(30):
        busy.record(2, 100.0)  # but a pass that stays slow is priced as timed
    assert busy.relative(2) == pytest.approx(2.0, rel=0.01)


def test_a_time_far_past_its_average_moves_it_as_one_half_again_would():
    """Draft steps and passes are timed on a shared machine, where another tenant now and then
    takes the cores: one such sample must not price a draft out for good."""
    assert timed_ema(None, 100.0) == 100.0  # a first time is itself
    assert timed_ema(10.0, 100.0) == pytest.approx(10.0 + 0.2 * (15.0 - 10.0))
    assert timed_ema(10.0, 5.0) == pytest.approx(9.0)  # faster: as timed
    steps = 10.0
    for _ in range(40):
        steps = timed_ema(steps, 30.0)  # a lasting slow-down is followed
    assert steps == pytest.approx(30.0, rel=0.01)


def test_draft_length_follows_acceptance_and_measured_cost():
    cost = CostModel(prior={1: 1.0, 2: 1.8, 4: 1.5, 8: 1.4, 16: 1.7})
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    _, gain_low = best_draft_length(0.1, 8, cost)
    assert gain_low < 1.0  # a poor source is not worth a verification pass
    k_high, gain_high = best_draft_length(0.9, 8, cost)
    assert gain_high > 2.0 and k_high >= 6
    # Once a 3-token pass is measured as cheap, short drafts become attractive.
    for _ in range(30):
        cost.record(1, 10.0)
        cost.record(2, 10.5)
    assert cost.relative(2) == pytest.approx(1.05, rel=0.01)
    assert best_draft_length(0.3, 1, cost)[1] > 1.0


def test_a_draft_riding_on_a_prefill_pass_is_priced_by_the_rows_it_adds():
    # Decode passes over 2 tokens cost 1.8 steps; 16 rows on a 448-token prefill ~0.5 of a step.
    cost = CostModel(prior={1: 1.0, 2: 1.8, 4: 1.5, 8: 1.4, 16: 1.7, 32: 2.8, 256: 8.4, 512: 17.2})
    assert cost.verify(4) == cost.relative(5)  # a decode step verifies k drafts in a (k+1)-token pass
    with cost.riding(448):
        assert 1.0 < cost.verify(4) < cost.verify(16) < 1.6 < cost.relative(17)
        assert best_draft_length(0.15, 16, cost)[1] > 1.05  # a weak 1-token n-gram match
        assert best_draft_length(0.3, 16, cost)[0] >= 2  # is worth a few rows of a pass that runs anyway
        with cost.riding(3):  # a short tail (the prefix cache held the rest) is a decode step
            assert cost.verify(4) == cost.relative(5)
    assert cost.riding_on == 0
    assert best_draft_length(0.15, 16, cost)[1] < 1.0  # outside the prefill it is not


def test_auto_does_not_speculate_where_the_expected_gain_is_below_one():
    auto = make_drafter("auto")
    assert isinstance(auto, AutoDrafter)
    seq = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2]
    auto.begin(seq, GREEDY, None)
    assert auto.propose(seq, 8).source == "ngram"  # a long match: confident
    for _ in range(40):  # that source keeps failing: auto stops using it
        auto.observe(auto.ngram.propose(seq, 8), 0)
    proposals = [auto.propose(seq, 8) for _ in range(auto.PROBE_EVERY - 1)]
    assert all(len(p) == 0 for p in proposals)
    assert len(auto.propose(seq, 8)) > 0  # but it probes now and then
    assert len(auto.propose([5, 6, 7, 8], 8)) == 0  # no match, no draft model: no speculation


def test_unknown_drafter_and_model_drafter_without_a_model_are_clear_errors():
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("magic")
    with pytest.raises(ValueError, match="needs a draft model"):
        make_drafter("model")


def test_auto_uses_the_draft_model_where_no_ngram_match_is_confident():
    model = loaded(tiny_model(3, layers=1, logit_scale=50.0))  # a confident draft model
    auto = make_drafter("auto", draft_model=model)
    seq = [10, 20, 30, 40]  # no repetition: the n-gram source has nothing
    auto.begin(seq, GREEDY, None)
    auto.model.propose_exactly(seq, 1)  # the draft model has seen the prompt
    auto.cost.record(1, 60.0)
    auto.model.step_ms = 6.0  # a draft step costs a tenth of a target step
    for _ in range(20):
        auto.model.stats.update(0, 8, 8)  # and its drafts are accepted
    draft = auto.propose(seq, 8)
    assert draft.source == "model" and len(draft) >= 3  # as far as its confidence pays
    auto.model.step_ms = 60.0  # as slow as the target: drafting cannot pay
    for _ in range(20):
        auto.model.stats.update(0, 1, 8)
    assert [len(auto.propose(seq, 8)) for _ in range(5)] == [0] * 5


def test_auto_feeds_a_cold_prompt_to_the_draft_model_once_what_it_missed_pays_for_it():
    """A ski rental: passes the caught-up draft model would have won tally what it would have
    saved; the catch-up is paid when the tally reaches its cost, and never for a model whose
    drafts cannot pay."""
    model = loaded(tiny_model(3, layers=1, logit_scale=50.0))
    auto = make_drafter("auto", draft_model=model)
    seq = list(range(10, 310))  # no repetition: the n-gram source has nothing
    auto.begin(seq, GREEDY, None)
    auto.cost.record(1, 60.0)
    auto.model.step_ms = 20.0  # a third of a target step
    for _ in range(20):
        auto.model.stats.update(0, 3, 4)  # three of four drafted tokens are accepted
    assert auto.model.tokens_behind(seq) == auto.model.window  # a cold prompt's last tokens
    skipped = 0
    while (draft := auto.propose(seq, 8)).source != "model":
        assert len(draft) == 0 and skipped < 50
        skipped += 1
    assert skipped >= 3 and len(draft) >= 1  # not at once: the catch-up costs more than a pass saves
    assert auto.model.tokens_behind(seq) == 1  # caught up (its last token is fed with the next draft)
    assert auto.propose(seq, 8).source == "model"  # and from then on it drafts
    slow = make_drafter("auto", draft_model=model)
    slow.begin(seq, GREEDY, None)
    slow.cost.record(1, 60.0)
    slow.model.step_ms = 60.0  # as slow as the target: its drafts cannot pay
    assert [len(slow.propose(seq, 8)) for _ in range(100)] == [0] * 100
    assert slow.model.tokens_behind(seq) == slow.model.window


def test_ngram_extends_matches_backwards_to_find_the_copy_being_retyped():
    # The block [1..9] is copied; the suffix (5, 6) also occurs later, after other context.
    block = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    live = block + [40, 41, 5, 6, 50, 51] + [1, 2, 3, 4, 5, 6]
    drafter = NgramDrafter(min_n=1, max_n=2, max_draft=3)
    drafter.begin(live, GREEDY, None)
    match = drafter.lookup(live, 3)
    # Most recent 2-gram would give [50, 51]; the copy agrees for 6 tokens and gives [7, 8, 9].
    assert match.tokens == [7, 8, 9] and match.length == 6 and match.skipped == 0


def test_ngram_agreement_steps_over_a_token_boundary_that_differs():
    # The same text tokenized differently in one spot: 30 in the copy, 31, 32 in the sequence.
    copy = [1, 2, 3, 4, 30, 5, 6, 7, 8, 9, 10]
    retyped = [1, 2, 3, 4, 31, 32, 5, 6, 7]
    index = TokenIndex(copy, min_n=1, max_n=3)
    # Backwards from just after 7 in both: 7, 6, 5 agree, then 30 meets 32.
    assert index.agreement(8, retyped, 9, 64, resyncs=0) == 3
    assert index.agreement(8, retyped, 9, 64) == 7  # 7, 6, 5, then 4, 3, 2, 1 past the spot
    assert index.agreement(8, retyped, 9, 5) == 5  # never more than the limit


def test_ngram_matches_a_copy_whose_last_token_is_tokenized_differently():
    # The sequence ends inside what the copy holds as one token (99 stands for 98 in the copy).
    block = list(range(1, 20)) + [98, 60, 61, 62]
    live = block + [70] + list(range(1, 20)) + [99]
    drafter = NgramDrafter(min_n=1, max_n=4, max_draft=3)
    drafter.begin(live, GREEDY, None)
    match = drafter.lookup(live, 3)
    assert match.skipped == 1 and match.length == 0 and match.tokens == [60, 61, 62]
    # A short context does not count as a copy: no match rather than a guess.
    short = [7, 98, 60, 61, 70, 7, 99]
    drafter.begin(short, GREEDY, None)
    assert drafter.lookup(short, 3) is None


def test_ngram_prefers_the_match_with_more_to_propose_among_equally_long_ones():
    # A run of zeros after the same context: it matches right behind the cursor, with one token
    # after it, and in the earlier copy, with the rest of the copied line after it.
    context = list(range(100, 140))
    live = context + [0] * 12 + [7, 8, 9] + [55] + context + [0] * 12
    drafter = NgramDrafter(min_n=1, max_n=4, max_draft=4)
    drafter.begin(live, GREEDY, None)
    match = drafter.lookup(live, 4)
    assert match.tokens == [7, 8, 9, 55] and match.length >= NgramDrafter.SURE_MATCH
