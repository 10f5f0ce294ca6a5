"""The head drafter: speculative decoding with the draft head stays exact (greedy) and lossless
(sampling), its drafts are priced, steered and stopped as they should be, and heads load or are
refused as they should."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pytest
import torch

from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.draft_head.network import DraftHead, HeadConfig
from speculative_complete.decoding.drafters import AutoDrafter, load_head_drafter, make_drafter
from speculative_complete.decoding.drafters.head import HeadDrafter
from speculative_complete.decoding.drafters.length import AcceptanceStats
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from speculative_complete.decoding.kv_cache import PrefixCache
from speculative_complete.decoding.verify import SamplingParams
from tests.support.draft_heads import own_sequences, tiny_head, trained_tiny_head
from tests.support.greedy_cases import MAX_NEW, expected_output, make_case
from tests.support.lean_forward import lean_loaded, plain_greedy_pass
from tests.support.sampling import PROMPT, SAMPLES, chi_square_pvalue, exact_joint
from tests.support.tiny_models import TINY_VOCAB, TinyTokenizer, tiny_model


@pytest.fixture(scope="module")
def targets():
    return [
        from_transformers(tiny_model(seed, layers=2, logit_scale=scale), 0)
        for seed, scale in [(41, 3.0), (42, 8.0)]
    ]


@pytest.fixture(scope="module")
def heads(targets):
    return [trained_tiny_head(t, seed=i) for i, t in enumerate(targets)]


def head_drafter(target, head, max_draft: int = 4, bits: int | None = None) -> HeadDrafter:
    """A drafter on a copy of ``head`` (a drafter converts its head in place)."""
    eos: set[int] = set()
    rows = target.output_rows(head.vocab)
    return HeadDrafter(copy.deepcopy(head), target.embed, rows, TINY_VOCAB, eos, max_draft, bits=bits)


@pytest.mark.parametrize("bits", [None, 4])
def test_the_trained_head_agrees_with_its_target_mostly(targets, heads, bits):
    """The tiny heads learn something, so the exactness tests below see drafts kept and rejected;
    on the 4-bit kernel (what the server runs) as in fp32."""
    target, head = targets[0], heads[0]
    drafter = head_drafter(target, head, bits=bits)
    agree = total = 0
    for tokens in own_sequences(target, 8, 40, seed=99):
        cache = target.new_cache()
        target(tokens[:20], cache)
        drafter.attach(cache)
        draft = drafter.propose_exactly(tokens[:21], 1)
        agree += draft.tokens == tokens[21:22]
        total += 1
    assert agree >= total // 2


@pytest.mark.parametrize("drafter_name,bits", [("head", None), ("head", 4), ("auto", 4)])
def test_speculative_greedy_with_the_head_equals_plain_greedy(targets, heads, drafter_name, bits):
    """200 prompt/stop cases, as for every drafter: drafts chain over tokens the target has not
    fed, ride on prefills, get cut by EOS, stops and the token limit, and are rejected anywhere."""
    proposed = accepted = 0
    for i in range(200):
        rng, prompt, variant = make_case(i)
        target, head = targets[i % 2], heads[i % 2]
        reference = plain_greedy_pass(target, prompt, MAX_NEW)
        kwargs, eos, want_tokens, want_text = expected_output(reference, variant, rng)
        engine = SpeculativeEngine(lean_loaded(target, eos))
        drafter = make_drafter(
            drafter_name,
            draft_head=head_drafter(target, head, rng.choice([2, 4, 8]), bits),
            cost=engine.cost,
            max_draft=8,
        )
        if drafter_name == "auto":
            drafter.MIN_GAIN = 0.0
        # Mostly full-length drafts (the tiny heads are rarely confident), some sized by confidence.
        (drafter.head if drafter_name == "auto" else drafter).confident = i % 4 == 0
        result = engine.generate(prompt, GenerationConfig(**kwargs), drafter)
        assert result.token_ids == want_tokens, f"case {i}: {drafter_name} diverged from greedy"
        assert result.text == want_text
        stats = result.stats.drafters.get("head")
        if stats is not None:
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert proposed > 200 and 0 < accepted < proposed


def sample_first_tokens(engine, drafter, params: SamplingParams) -> tuple[dict, int, int]:
    """``SAMPLES`` seeded generations of 4 tokens after ``PROMPT``: counts of their first two
    tokens, and the draft tokens proposed and accepted in all."""
    config = GenerationConfig(max_new_tokens=4, temperature=params.temperature, top_k=params.top_k)
    config.top_p = params.top_p
    counts: dict[tuple[int, ...], int] = {}
    proposed = accepted = 0
    for seed in range(SAMPLES):
        config.seed = seed
        result = engine.generate(PROMPT, config, drafter)
        key = tuple(result.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        for stats in result.stats.drafters.values():
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    return counts, proposed, accepted


@pytest.fixture(scope="module")
def sampling_pair():
    model = tiny_model(21, layers=2, logit_scale=3.0)
    target = from_transformers(model, 0)
    return model, target, trained_tiny_head(target, steps=60)


@pytest.mark.parametrize("drafter_name", ["head", "auto"])
def test_sampling_with_the_head_keeps_the_targets_distribution(sampling_pair, drafter_name):
    """As shipped: the head on the 4-bit kernel, confident. Its cost model is the CPU's prior,
    not the engine's live timings: a tiny target's step costs what a head step does, which would
    price every draft out."""
    model, target, head = sampling_pair
    params = SamplingParams(temperature=1.0, top_k=6)
    engine = SpeculativeEngine(lean_loaded(target))
    drafter = make_drafter(drafter_name, draft_head=head_drafter(target, head, 3, 4))
    counts, proposed, accepted = sample_first_tokens(engine, drafter, params)
    assert chi_square_pvalue(counts, exact_joint(model, PROMPT, params, 2)) > 0.001
    assert proposed > SAMPLES // 4 and 0 < accepted < proposed  # ``auto`` drafts less: it weighs


@pytest.mark.parametrize("drafter_name", ["head", "auto"])
@pytest.mark.parametrize(
    "params",
    [SamplingParams(1.0, top_k=6), SamplingParams(0.7, top_p=0.9), SamplingParams(1.3, top_k=8, top_p=0.95)],
)
def test_sampling_with_a_confident_head_keeps_the_targets_distribution(sampling_pair, drafter_name, params):
    """A head far surer than it should be (its scores 20 times the trained ones, so its q is
    peaked where the target's p is not), drafting only while its confidence beats what a token
    costs (``confident``, as shipped; a fixed cost model puts that bar near 0.5). A head that
    drew a token and then dropped it for its own low probability drafted from q restricted to
    its likely tokens while the engine's acceptance rule was told q; and ``auto`` then fell
    back to the n-gram match, a choice of source that depended on the drawn token. Both biased
    the output (here by p < 1e-6 on the old code, which decided after drawing).

    Power: the chi-square on the first two tokens' pooled joint (~20 cells of 5000 samples at
    alpha = 0.001) catches a shift as large as a two-token model of the old rule gives
    (p = (.5, .5), q = (.9, .1), bar .5: P(first token) .547 against .5, a noncentrality of
    5000 * 2 * .047^2 / .5 = 44) with probability 0.92 (scipy.stats.ncx2(19, 44).sf(43.8)).
    """
    model, target, head = sampling_pair
    engine = SpeculativeEngine(lean_loaded(target))
    rows = target.output_rows(head.vocab) * 20.0
    sure = HeadDrafter(copy.deepcopy(head), target.embed, rows, TINY_VOCAB, set(), 3, bits=4)
    drafter = make_drafter(drafter_name, draft_head=sure, cost=engine.cost)
    sure.cost = CostModel(prior={1: 1.0, 2: 1.45, 3: 1.9, 4: 2.35, 5: 2.8})  # a keep bar near 0.5
    if drafter_name == "auto":  # the head chosen on every step by its record, the n-gram beside it
        sure.stats = AcceptanceStats(priors={0: 0.9}, prior_weight=1e9)
        drafter.ngram.stats = AcceptanceStats(priors={b: 0.3 for b in (1, 2, 4, 8, 16, 32)}, prior_weight=1e9)
    counts, proposed, accepted = sample_first_tokens(engine, drafter, params)
    assert chi_square_pvalue(counts, exact_joint(model, PROMPT, params, 2)) > 0.001
    assert proposed > SAMPLES // 4 and 0 < accepted < proposed


class NoHiddenStates:
    length = 5


def test_a_confident_draft_goes_only_as_far_as_its_chance_of_being_kept_pays(targets, heads):
    """With ``confident`` the head drafts while the product of its own token probabilities beats
    what one more token costs: every token when verifying is free, none when a wider pass costs
    more than any chance; always a prefix of the plain draft, and priced even when empty."""
    target, head = targets[0], heads[0]
    drafter = head_drafter(target, head, max_draft=4)
    tokens = own_sequences(target, 1, 30, seed=7)[0]
    cache = target.new_cache()
    target(tokens[:20], cache)
    drafter.attach(cache)
    plain = drafter.propose_exactly(tokens[:21], 4).tokens
    drafter.cost = CostModel(prior={1: 1.0, 64: 1.0}, measured_ms={1: 1e12})  # verifying is free
    drafter._chain_ms = 0.0  # and so is a head step (against an endless target step)
    assert drafter.propose_exactly(tokens[:21], 4, confident=True).tokens == plain
    drafter.cost = CostModel(prior={1: 1.0, 2: 3.0, 64: 200.0})  # one more row costs 2 steps
    assert drafter.propose_exactly(tokens[:21], 4, confident=True).tokens == []
    assert drafter.step_ms is not None and drafter.step_ms > 0  # the empty proposal was timed
    drafter.cost = CostModel(prior={1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9, 5: 2.2})  # in between
    drafted = drafter.propose_exactly(tokens[:21], 4, confident=True).tokens
    assert drafted == plain[: len(drafted)]


@torch.no_grad()
def test_a_slow_first_step_does_not_price_the_head_out_for_good(targets, heads):
    """A head's chained steps are priced by their measured time. Its kernels are loaded when it
    is made (a first step timed while CUDA loaded them priced every draft out against a 3.6 ms
    target step: on an H200 the head drafted nothing), and the one-entry pass that catches it up
    with each accepted token is timed as a step too: a price measured too high comes down even
    while it drafts nothing, and drafting resumes."""
    target, head = targets[0], heads[0]
    drafter = head_drafter(target, head, max_draft=4)
    assert drafter._cache.length == 0 and drafter._chain_ms is None  # warmed up, nothing kept
    tokens = own_sequences(target, 1, 60, seed=7)[0]
    cache = target.new_cache()
    target(tokens[:20], cache)
    drafter.attach(cache)
    drafter.cost = CostModel(prior={1: 1.0, 64: 1.0}, measured_ms={1: 1000.0})  # free verifying
    drafter._chain_ms = 50_000.0  # a cold step: 50 target steps
    assert drafter.propose_exactly(tokens[:21], 4, confident=True).tokens == []
    drafted = []
    for n in range(21, 59):  # the target feeds one token at a time; the head drafts nothing...
        target(tokens[n - 1 : n], cache)
        drafted.append(len(drafter.propose_exactly(tokens[: n + 1], 4, confident=True).tokens))
    assert drafter._chain_ms < 1000.0  # ...but its catch-up steps are timed: the price came down
    assert drafted[0] == 0 and drafted[-1] > 0  # and it drafts again


def test_the_confidence_temperature_weighs_drafts_but_never_changes_them(targets, heads):
    """A head's fitted ``confidence_temperature`` divides its scores only where its probability
    for its own draft decides how far to draft: the same tokens, a sharper probability below 1."""
    target, head = targets[0], heads[0]
    tokens = own_sequences(target, 1, 30, seed=7)[0]
    cache = target.new_cache()
    target(tokens[:20], cache)
    chosen = {}
    for temperature in (1.0, 0.5):
        tempered = copy.deepcopy(head)
        tempered.config = replace(head.config, confidence_temperature=temperature)
        drafter = head_drafter(target, tempered)
        drafter.attach(cache)
        g = drafter._sync(tokens[:21], 20)
        scores = drafter._score(g)
        token, confidence = drafter._best(drafter._scores(g)), drafter._confidence(drafter._scores(g))
        assert confidence == pytest.approx(float(torch.softmax(scores / temperature, -1).max()), rel=1e-5)
        chosen[temperature] = (token, confidence, drafter.propose_exactly(tokens[:21], 4).tokens)
    assert chosen[0.5][0] == chosen[1.0][0] and chosen[0.5][2] == chosen[1.0][2]
    assert chosen[0.5][1] > chosen[1.0][1]


def auto_over_a_repeat(target, head) -> tuple[list[int], list[int], AutoDrafter, object]:
    """``auto`` with the head, after a sequence whose tail repeats its start (an n-gram match to
    draft from): the sequence's start, the sequence, the drafter, and the target's cache it is
    attached to (held weakly by the drafter: the caller keeps it)."""
    first = own_sequences(target, 1, 14, seed=7)[0]
    tokens = first + first[:6]
    cache = target.new_cache()
    target(tokens[:-1], cache)
    auto = make_drafter("auto", draft_head=head_drafter(target, head, bits=4), cost=CostModel())
    auto.attach(cache)
    return first, tokens, auto, cache


def test_auto_drafts_the_ngram_match_where_the_head_it_chose_is_unsure(targets, heads):
    """``auto`` picks the head by its record, but the head drafts nothing where it is unsure even
    of its first token: then the n-gram match it was weighed against is drafted, not nothing."""
    first, tokens, auto, _cache = auto_over_a_repeat(targets[0], heads[0])
    auto.head.stats = AcceptanceStats(priors={0: 0.99})  # its record says it is nearly always right
    auto.ngram.stats = AcceptanceStats(priors={b: 0.3 for b in (1, 2, 4, 8)})
    auto.head.confident = False  # drafting its full length (the tiny head is rarely sure)
    sure = auto.propose(tokens, 4)
    assert sure.source == "head" and len(sure.tokens) == 4
    auto.head.confident, auto.head._chain_ms = True, 1e12  # no token is worth its cost now
    unsure = auto.propose(tokens, 4)
    assert unsure.source == "ngram" and unsure.tokens == first[6 : 6 + len(unsure.tokens)]
    assert unsure.tokens


@dataclass
class OwedByPrefix:
    """An ``OwedText`` given as what healing owes after each drafted prefix (what the engine's
    ``Healing`` answers from its constraint)."""

    after: Callable[[list[int]], tuple[bytes, tuple[int, ...]] | None]

    def allowed_after(self, tokens: Sequence[int]) -> tuple[bytes, tuple[int, ...]] | None:
        return self.after(list(tokens))

    def allowed_length(self, tokens: Sequence[int]) -> int:
        for i, token in enumerate(tokens):
            owed = self.after(list(tokens[:i]))
            if owed is None:
                return len(tokens)
            if token not in owed[1]:
                return i
        return len(tokens)


def test_while_healing_owes_text_auto_weighs_an_ngram_match_only_as_far_as_the_text_allows(targets, heads):
    """An n-gram match whose first token healing refuses would be cut to nothing by the engine:
    ``auto`` must then draft from the head (steered) instead of choosing that match. A match the
    text allows is still chosen, whole once the text is written."""
    first, tokens, auto, _cache = auto_over_a_repeat(targets[0], heads[0])
    auto.ngram.stats = AcceptanceStats(priors={b: 0.99 for b in (1, 2, 4, 8)})  # the match wins
    auto.head.stats = AcceptanceStats(priors={0: 0.8})
    auto.head.confident = False
    assert auto.propose(tokens, 4).source == "ngram"
    refused = tuple(t for t in range(20, 44) if t != first[6])
    auto.steer(OwedByPrefix(lambda drafted: (b"refuses the match", refused) if not drafted else None))
    steered = auto.propose(tokens, 4)
    assert steered.source == "head" and steered.tokens and steered.tokens[0] in refused
    auto.steer(OwedByPrefix(lambda drafted: (b"allows the match", (first[6],)) if not drafted else None))
    kept = auto.propose(tokens, 4)
    assert kept.source == "ngram" and kept.tokens == first[6:10]
    not_next = tuple(t for t in range(20, 44) if t != first[7])
    owed = {0: (b"allows the match", (first[6],)), 1: (b"refuses its second", not_next)}
    auto.steer(OwedByPrefix(lambda drafted: owed.get(len(drafted))))
    cut = auto.propose(tokens, 4)  # the match goes one token along the text, then is cut
    assert cut.tokens[:1] == [first[6]] and cut.tokens[1:2] != [first[7]]


def drafting_after_a_prompt(forward, head):
    """A head drafter with ``confident`` off (it drafts every step asked for), attached to a cache
    that holds a 20-token sequence but its last token. The cache comes back too: the drafter holds
    it only weakly, and drafts nothing once it is gone."""
    drafter = head_drafter(forward, head, max_draft=4)
    drafter.confident = False
    tokens = own_sequences(forward, 1, 20, seed=3)[0]
    cache = forward.new_cache()
    forward(tokens[:-1], cache)
    drafter.attach(cache)
    return drafter, tokens, cache


def test_while_healing_owes_text_the_head_drafts_among_what_it_allows(targets, heads):
    """Steered by token healing (the engine passes its ``Healing``), the head's greedy
    draft chooses among the allowed tokens while text is owed, and freely after it."""
    drafter, tokens, _cache = drafting_after_a_prompt(targets[0], heads[0])
    free = drafter.propose_exactly(tokens, 3).tokens
    assert len(free) == 3
    allowed = tuple(t for t in range(20, 44) if t != free[0])
    drafter.steer(OwedByPrefix(lambda drafted: (b"owed", allowed) if not drafted else None))
    steered = drafter.propose_exactly(tokens, 3).tokens
    assert steered[0] in allowed and len(steered) == 3
    drafter.steer(OwedByPrefix(lambda drafted: (b"outside", (0, 1, 2))))  # none the head scores (HEAD_VOCAB)
    assert drafter.propose_exactly(tokens, 3).tokens == []
    drafter.steer(None)
    assert drafter.propose_exactly(tokens, 3).tokens == free


def test_a_greedy_head_draft_stops_before_a_token_that_ends_the_generation(targets, heads):
    """Shown which tokens end the generation (the engine's ``EndingTokens``: a line's end, an
    end-of-text token), the head's greedy draft stops before the first one it would draft: the
    target's pass gives its own token there anyway, so the steps after it are time for nothing."""
    drafter, tokens, _cache = drafting_after_a_prompt(targets[0], heads[0])
    free = drafter.propose_exactly(tokens, 3).tokens
    assert len(free) == 3
    drafter.end_at(lambda token: token == free[1])
    assert drafter.propose_exactly(tokens, 3).tokens == free[:1]
    drafter.end_at(lambda token: token == free[0])
    assert drafter.propose_exactly(tokens, 3).tokens == []
    drafter.end_at(lambda token: False)
    assert drafter.propose_exactly(tokens, 3).tokens == free


@pytest.mark.parametrize("drafter_name", ["head", "auto"])
def test_healed_greedy_with_the_head_equals_masked_greedy_and_its_drafts_ride(targets, heads, drafter_name):
    """A healed prompt whose required character is not what the target would write: the steered
    head drafts that character and what follows, on the prefill, and the output stays exact;
    ``auto`` too, where the prompt's repeats give the n-gram source matches healing refuses."""
    tok = TinyTokenizer()
    rode = 0
    for i in range(40):
        rng, prompt, _ = make_case(i)
        target, head = targets[i % 2], heads[i % 2]
        forced = rng.choice([t for t in range(TINY_VOCAB) if t != tok.newline_id])
        want = [forced] + plain_greedy_pass(target, prompt + [forced], 7)
        if len(prompt) < 3:
            continue
        engine = SpeculativeEngine(lean_loaded(target), prefix_cache=PrefixCache(1 << 24))
        drafter = head_drafter(target, head, 4, 4)
        drafter.confident = False
        if drafter_name == "auto":
            drafter = make_drafter("auto", draft_head=drafter, cost=CostModel())
        # The keystroke before fed all but the last token: the head can draft at once.
        engine.generate(prompt[:-1], GenerationConfig(max_new_tokens=1), cache_key="doc")
        config = GenerationConfig(max_new_tokens=8, required_prefix=tok.piece(forced))
        result = engine.generate(prompt, config, drafter, cache_key="doc")
        assert result.token_ids == want, f"case {i}"
        rode += result.stats.prefill_tokens > 1
    assert rode > 10


def test_the_head_waits_for_the_targets_states():
    """No state in the target's cache, or too many tokens past it: no draft (nothing to read)."""
    forward = from_transformers(tiny_model(5, layers=1), 0)
    drafter = head_drafter(forward, tiny_head(forward))
    tokens = list(range(20))
    assert drafter.propose_exactly(tokens, 3).tokens == []  # nothing attached
    cache = forward.new_cache()
    forward(tokens[:10], cache)
    drafter.attach(cache)
    assert drafter.propose_exactly(tokens, 3).tokens == []  # 9 tokens past the cache
    assert len(drafter.propose_exactly(tokens[:14], 3).tokens) == 3  # 3 past it: chained over
    other = NoHiddenStates()  # a cache without hidden states (transformers')
    drafter.attach(other)
    assert drafter.propose_exactly(tokens[:6], 3).tokens == []


def test_heads_load_by_name_and_are_refused_for_another_model(tmp_path, targets, heads):
    target, head = targets[0], heads[0]
    loaded = lean_loaded(target)
    head.save(tmp_path / "mine")
    drafter = load_head_drafter(loaded, str(tmp_path / "mine" / "model.safetensors"))
    assert torch.equal(drafter.head.vocab, head.vocab)
    assert load_head_drafter(loaded, "none") is None
    assert load_head_drafter(loaded, "auto") is None  # nothing shipped for a random model
    with pytest.raises(ValueError, match="another model"):
        load_head_drafter(lean_loaded(targets[1]), str(tmp_path / "mine"))
    with pytest.raises(ValueError, match="not found"):
        load_head_drafter(loaded, str(tmp_path / "missing"))


def test_a_published_eagle_head_loads_from_its_folder(tmp_path, targets):
    """EAGLE-1's layout: a transformers Llama config, ``fc`` with a bias, no input norm on the
    layer, no list of scored tokens (the whole vocabulary)."""
    from safetensors.torch import save_file

    target = targets[0]
    s = target.shape
    eagle = DraftHead(HeadConfig(s.dim, s.heads, s.kv_heads, s.ffn, s.rope_theta, input_norm=False))
    weights = {k: v for k, v in eagle.state_dict().items() if k != "vocab"}
    save_file(weights, str(tmp_path / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": s.dim,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "intermediate_size": s.ffn,
        "rope_theta": s.rope_theta,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = load_head_drafter(lean_loaded(target), str(tmp_path))
    assert drafter.head.layers[0].input_layernorm is None and not len(drafter.head.vocab)
    cache = target.new_cache()
    target(list(range(10)), cache)
    drafter.attach(cache)
    assert len(drafter.propose_exactly(list(range(11)), 3).tokens) == 3
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="cannot be read"):
        load_head_drafter(lean_loaded(target), str(tmp_path))


@pytest.mark.real_model
def test_the_shipped_head_drafts_for_the_default_model_on_held_out_code(default_model):
    """For real: ``auto`` finds the head shipped for the embedded model; on stdlib files it was
    not trained on, greedy output with it is the model's own, priced by this machine's measured
    passes as shipped; and priced by the CPU prior alone (the same on every machine: how much the
    head drafts depends on what a wider pass costs here), most of its drafts are kept."""
    from benchmarks.decode_bench import stdlib_files

    head = load_head_drafter(default_model, "auto")
    assert head is not None and head.folder.endswith("smollm2-135m-instruct")
    engine = SpeculativeEngine(default_model)
    config = GenerationConfig(max_new_tokens=24)
    proposed = accepted = 0
    for rel, path in stdlib_files()[:60:10]:
        text = path.read_text(encoding="utf-8")
        ids = engine.encode(text[: len(text) // 2])[-300:]
        plain = engine.generate(ids, config)
        shipped = engine.generate(ids, config, make_drafter("head", draft_head=head, cost=engine.cost))
        assert shipped.token_ids == plain.token_ids, rel
        priced = make_drafter("head", draft_head=head, cost=CostModel.for_device("cpu"))
        with_head = engine.generate(ids, config, priced)
        assert with_head.token_ids == plain.token_ids, rel
        stats = with_head.stats.drafters.get("head")  # none where the head was never confident
        if stats is not None:
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert accepted >= 0.2 * proposed and proposed >= 30  # an untrained head: ~0
