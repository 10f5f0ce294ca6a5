"""Prefix KV-cache reuse: exact under any edit sequence, bounded in memory, cancellable prefill.

Exactness is checked against ``plain_greedy`` (an independent reference that always prefills the
whole prompt), on tiny seeded models in fp32, for every drafter, over edit sequences that append
(typing), change text before the cursor, undo, and close and reopen a document.
"""

from __future__ import annotations

import random
import threading

import pytest

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.kv_cache import PrefixCache, cache_length
from tests.support.reference import plain_greedy
from tests.support.tiny_models import TINY_VOCAB, loaded, tiny_model

MB = 1 << 20


def edit_sequence(seed: int) -> list[tuple[str, list[int]]]:
    """(action, prompt) steps as an editor produces them: typing, an edit earlier, undo, reopen."""
    rng = random.Random(seed)
    doc = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(20, 60))]
    steps: list[tuple[str, list[int]]] = [("open", list(doc))]
    for _ in range(rng.randint(2, 5)):  # typing at the end
        doc.append(rng.randrange(TINY_VOCAB))
        steps.append(("type", list(doc)))
    before_edit = list(doc)
    where = rng.randrange(1, len(doc) - 2)
    doc[where] = (doc[where] + 1) % TINY_VOCAB  # an edit well before the cursor
    steps.append(("edit-before", list(doc)))
    doc = before_edit  # undo
    steps.append(("undo", list(doc)))
    doc = doc[:-3]  # deleting backwards
    steps.append(("delete", list(doc)))
    steps.append(("close", []))
    steps.append(("reopen", list(doc)))
    return steps


@pytest.fixture(scope="module")
def target():
    return tiny_model(21, layers=2, logit_scale=8.0)


@pytest.fixture(scope="module")
def draft():
    return tiny_model(22, layers=1, logit_scale=8.0)


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "model", "auto"])
def test_reuse_gives_the_same_tokens_as_a_fresh_prefill_under_any_edits(target, draft, drafter_name):
    config = GenerationConfig(max_new_tokens=12, prefill_chunk=16)
    reused_somewhere = False
    for seed in range(8):
        store = PrefixCache(64 * MB)
        engine = SpeculativeEngine(loaded(target), prefix_cache=store)
        drafter = make_drafter(
            drafter_name, draft_model=loaded(draft), cost=engine.cost, session_cache_bytes=16 * MB
        )
        previous: list[int] = []
        for action, prompt in edit_sequence(seed):
            if action == "close":
                store.drop("doc")
                previous = []
                continue
            result = engine.generate(prompt, config, drafter, cache_key="doc")
            want = plain_greedy(target, prompt, config.max_new_tokens)
            assert result.token_ids == want, f"seed {seed}, {action}: reuse changed the output"
            # Reuse never goes past the common prefix with what the document's entry held, and
            # misses none of it but the last prompt token (fed for its logits) off the greedy path.
            common = next(
                (i for i, (a, b) in enumerate(zip(previous, prompt, strict=False)) if a != b),
                min(len(previous), len(prompt)),
            )
            assert min(common, len(prompt) - 1) <= result.stats.reused_tokens <= common, (seed, action)
            reused_somewhere |= result.stats.reused_tokens > 0
            previous = prompt + result.token_ids
    assert reused_somewhere
    assert store.stats.reused_tokens > 0 and store.stats.hits > 0


def test_typing_along_the_suggestion_is_answered_from_the_known_continuation(target):
    """The user types the suggested tokens one by one: each answer needs no target pass, and
    equals what a fresh decode says."""
    engine = SpeculativeEngine(loaded(target), prefix_cache=PrefixCache(64 * MB))
    config = GenerationConfig(max_new_tokens=10)
    for seed in range(8):
        prompt = [random.Random(seed).randrange(TINY_VOCAB) for _ in range(25)]
        first = engine.generate(prompt, config, cache_key=f"d{seed}")
        assert first.stats.known_tokens == 0 and first.stats.target_passes == 10
        chain = prompt + first.token_ids  # the greedy path the document's entry knows
        for typed in range(1, 10):
            here = prompt + first.token_ids[:typed]
            result = engine.generate(here, config, cache_key=f"d{seed}")
            assert result.token_ids == plain_greedy(target, here, 10), (seed, typed)
            # What was known is served without a pass; only the tokens past it are decoded.
            assert result.stats.known_tokens == len(chain) - len(here)
            assert result.stats.target_passes == 10 - result.stats.known_tokens
            assert result.stats.reused_tokens == len(here)
            chain = here + result.token_ids
        # Asked again at the first place: answered entirely from the known chain.
        again = engine.generate(prompt, config, cache_key=f"d{seed}")
        assert again.token_ids == first.token_ids and again.stats.target_passes == 0


def test_the_known_continuation_is_not_used_for_sampling_or_off_the_greedy_path(target):
    engine = SpeculativeEngine(loaded(target), prefix_cache=PrefixCache(64 * MB))
    prompt = [random.Random(3).randrange(TINY_VOCAB) for _ in range(25)]
    first = engine.generate(prompt, GenerationConfig(max_new_tokens=6), cache_key="d")
    sampled = engine.generate(
        prompt, GenerationConfig(max_new_tokens=6, temperature=1.0, seed=1), cache_key="d"
    )
    assert sampled.stats.known_tokens == 0 and sampled.stats.target_passes >= 1
    # A sampled generation leaves no greedy chain behind.
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=6), cache_key="d").stats.known_tokens == 0
    # A prompt shorter than the one the chain grew from is user text, not model output.
    engine.generate(prompt, GenerationConfig(max_new_tokens=6), cache_key="d")
    shorter = engine.generate(prompt[:-1], GenerationConfig(max_new_tokens=6), cache_key="d")
    assert shorter.stats.known_tokens == 0
    assert shorter.token_ids == plain_greedy(target, prompt[:-1], 6)
    assert first.token_ids == plain_greedy(target, prompt, 6)


def test_two_documents_keep_separate_caches(target):
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    config = GenerationConfig(max_new_tokens=4)
    a = [random.Random(1).randrange(TINY_VOCAB) for _ in range(30)]
    b = [random.Random(2).randrange(TINY_VOCAB) for _ in range(30)]
    engine.generate(a, config, cache_key="a")
    engine.generate(b, config, cache_key="b")
    again = engine.generate(a + [5], config, cache_key="a")
    assert again.stats.reused_tokens == len(a)
    assert again.token_ids == plain_greedy(target, a + [5], 4)
    assert engine.generate(b + [5], config, cache_key="b").stats.reused_tokens == len(b)


def test_without_a_key_nothing_is_kept(target):
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    prompt = list(range(20))
    engine.generate(prompt, GenerationConfig(max_new_tokens=3))
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=3)).stats.reused_tokens == 0
    assert store.snapshot()["entries"] == 0


def test_the_memory_budget_holds_over_many_documents_and_evicts_the_oldest(target):
    # one prefill pass each: a cache's size then does not depend on how the pace split the prompt
    config = GenerationConfig(max_new_tokens=4, prefill_ms=None)
    probe = PrefixCache(1 << 40)
    engine = SpeculativeEngine(loaded(target), prefix_cache=probe)
    engine.generate(list(range(40)), config, cache_key="probe")
    per_doc = probe.snapshot()["bytes"]
    assert per_doc > 0
    budget = int(per_doc * 3.5)  # room for three documents' caches
    store = PrefixCache(budget)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    for i in range(20):
        prompt = [(i + j) % TINY_VOCAB for j in range(40)]
        engine.generate(prompt, config, cache_key=f"doc{i}")
        snap = store.snapshot()
        assert snap["bytes"] <= budget and snap["entries"] <= 3
    assert store.snapshot()["evictions"] == 17
    # The most recent documents survive; the first ones are gone.
    recent = [(19 + j) % TINY_VOCAB for j in range(40)] + [7]
    assert engine.generate(recent, config, cache_key="doc19").stats.reused_tokens == 40
    first = [j % TINY_VOCAB for j in range(40)]
    assert engine.generate(first, config, cache_key="doc0").stats.reused_tokens == 0


def test_a_cache_larger_than_the_budget_is_not_kept_and_zero_disables_reuse(target):
    for budget in (0, 1024):
        store = PrefixCache(budget)
        engine = SpeculativeEngine(loaded(target), prefix_cache=store)
        prompt = list(range(40))
        engine.generate(prompt, GenerationConfig(max_new_tokens=2), cache_key="d")
        assert store.snapshot()["entries"] == 0 and store.snapshot()["bytes"] == 0
        again = engine.generate(prompt, GenerationConfig(max_new_tokens=2), cache_key="d")
        assert again.stats.reused_tokens == 0


def test_a_cancelled_prefill_stops_between_chunks_and_keeps_what_it_prefilled(target):
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    prompt = [random.Random(5).randrange(TINY_VOCAB) for _ in range(100)]
    calls = {"n": 0}

    def cancel_after_two_chunks() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3  # the check before generation, then after chunk 1 and chunk 2

    config = GenerationConfig(max_new_tokens=8, prefill_chunk=16, prefill_ms=None)  # chunks of 16
    result = engine.generate(prompt, config, cancel=cancel_after_two_chunks, cache_key="d")
    assert result.stop_reason == "cancelled" and result.token_ids == []
    assert store.snapshot()["entries"] == 1
    resumed = engine.generate(prompt, config, cache_key="d")
    assert resumed.stats.reused_tokens == 32  # two chunks of 16
    assert resumed.token_ids == plain_greedy(target, prompt, 8)


def test_a_prompt_prefilled_apart_is_adopted_only_once_whole(target):
    """A document's renewed prompt is prefilled under a key of its own while the document's cache
    keeps serving; the document takes it over only when it holds the whole prompt, and then
    answers from it exactly."""
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    config = GenerationConfig(max_new_tokens=6, prefill_chunk=16)
    old = [random.Random(6).randrange(TINY_VOCAB) for _ in range(40)]
    new = [random.Random(7).randrange(TINY_VOCAB) for _ in range(60)]
    engine.generate(old, config, cache_key="doc")
    calls = {"n": 0}

    def cancel_after_two_chunks() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    engine.generate(new, config, cancel=cancel_after_two_chunks, cache_key="side")
    assert not store.adopt("side", "doc", new)  # 32 of 60 prefilled: the document keeps its own
    assert engine.generate(old + [3], config, cache_key="doc").stats.reused_tokens == len(old)
    engine.generate(new, config, cache_key="side")  # goes on from the 32
    assert store.adopt("side", "doc", new)
    assert store.chain("side") is None and store.snapshot()["entries"] == 1
    again = engine.generate(new + [3], config, cache_key="doc")
    assert again.stats.reused_tokens >= len(new)  # (3 may be the known greedy token: all reused)
    assert again.token_ids == plain_greedy(target, new + [3], 6)


def test_a_cancel_from_another_thread_during_a_long_prefill_takes_effect_between_chunks(target):
    engine = SpeculativeEngine(loaded(target), prefix_cache=PrefixCache(64 * MB))
    prompt = [random.Random(6).randrange(TINY_VOCAB) for _ in range(200)]
    stop = threading.Event()
    chunks = {"n": 0}
    forward = engine._forward

    def counting_forward(tokens, cache, *rest, **options):
        chunks["n"] += 1
        if chunks["n"] == 2:
            stop.set()  # as if the next keystroke arrived during the second chunk
        return forward(tokens, cache, *rest, **options)

    engine._forward = counting_forward
    result = engine.generate(
        prompt,
        GenerationConfig(max_new_tokens=8, prefill_chunk=8, prefill_ms=None),  # chunks of 8
        cancel=stop,
        cache_key="d",
    )
    assert result.stop_reason == "cancelled"
    assert chunks["n"] == 2  # stopped right after the chunk in flight, not after all 25
    cached = engine.prefix_cache.take("d", prompt).cache
    assert cached is not None and cache_length(cached) == 16


def test_the_draft_model_keeps_one_cache_per_session(target, draft):
    engine = SpeculativeEngine(loaded(target))
    drafter = make_drafter("model", draft_model=loaded(draft), cost=engine.cost, session_cache_bytes=64 * MB)
    a = [random.Random(7).randrange(TINY_VOCAB) for _ in range(30)]
    b = [random.Random(8).randrange(TINY_VOCAB) for _ in range(30)]
    config = GenerationConfig(max_new_tokens=6)
    engine.generate(a, config, drafter, cache_key="a")
    engine.generate(b, config, drafter, cache_key="b")
    assert drafter.sessions.snapshot()["entries"] == 1  # a's cache is parked while b decodes
    result = engine.generate(a + [3], config, drafter, cache_key="a")
    assert drafter.sessions.stats.reused_tokens >= len(a)
    assert result.token_ids == plain_greedy(target, a + [3], 6)


def test_the_growing_cache_gives_the_stock_caches_logits_through_appends_and_crops(target):
    """``new_cache`` writes into spare room instead of concatenating; whatever sequence of passes
    and roll-backs the engine makes, the logits must be the stock ``DynamicCache``'s."""
    import torch
    from transformers import DynamicCache

    from speculative_complete.decoding.forward.growing_cache import GrowingLayer, new_cache
    from speculative_complete.decoding.kv_cache import cache_nbytes

    model = target
    rng = random.Random(5)
    growing, stock = new_cache(model.config), DynamicCache(config=model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in growing.layers)
    reallocations, buffer = 0, None
    with torch.inference_mode():
        for step in range(60):
            if step and rng.random() < 0.3:  # a rejected draft or a cropped prefix
                drop = -rng.randint(1, min(6, cache_length(stock)))
                growing.crop(drop)
                stock.crop(drop)
            n = 40 if step == 0 else rng.randint(1, 9)
            ids = torch.tensor([[rng.randrange(TINY_VOCAB) for _ in range(n)]])
            mine = model(input_ids=ids, past_key_values=growing, use_cache=True).logits
            theirs = model(input_ids=ids, past_key_values=stock, use_cache=True).logits
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
            assert cache_length(growing) == cache_length(stock)
            now = growing.layers[0]._key_buffer.data_ptr()
            reallocations += buffer is not None and now != buffer
            buffer = now
    assert cache_length(stock) > 40 + GrowingLayer.SPARE  # it had to grow at least once
    assert 1 <= reallocations <= 3  # ...but not on every pass
    assert cache_nbytes(growing) >= cache_nbytes(stock)  # the spare room is counted against the budget


def test_dropping_a_key_while_its_cache_is_lent_keeps_nothing_the_generation_gives_back(target):
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    prompt = [random.Random(3).randrange(TINY_VOCAB) for _ in range(30)]
    engine.generate(prompt, GenerationConfig(max_new_tokens=4), cache_key="doc")
    closed = {"done": False}

    def close_mid_decode() -> bool:  # the document is closed while the engine holds its cache
        if not closed["done"] and store.snapshot()["lent"] == 1:
            store.drop("doc")
            closed["done"] = True
        return False

    engine.generate(
        prompt + [1], GenerationConfig(max_new_tokens=4), cancel=close_mid_decode, cache_key="doc"
    )
    assert closed["done"] and store.snapshot()["entries"] == 0 and store.snapshot()["lent"] == 0
    engine.generate(prompt, GenerationConfig(max_new_tokens=4), cache_key="doc")  # reopened: kept again
    assert store.snapshot()["entries"] == 1


def test_the_cache_remembers_the_last_request_and_decoding_ahead_keeps_it(target):
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    prompt = [random.Random(4).randrange(TINY_VOCAB) for _ in range(20)]
    engine.generate(prompt, GenerationConfig(max_new_tokens=4), cache_key="doc")
    chain = store.chain("doc")
    assert chain.asked.prompt_tokens == len(prompt) and chain.greedy_from == len(prompt)
    engine.generate(chain.tokens, GenerationConfig(max_new_tokens=4, ahead=True), cache_key="doc")
    ahead = store.chain("doc")
    assert len(ahead.tokens) > len(chain.tokens) and ahead.asked == chain.asked


def test_a_closed_session_drops_the_draft_models_cache_parked_or_live(target, draft):
    engine = SpeculativeEngine(loaded(target))
    drafter = make_drafter("model", draft_model=loaded(draft), cost=engine.cost, session_cache_bytes=64 * MB)
    a = [random.Random(7).randrange(TINY_VOCAB) for _ in range(30)]
    b = [random.Random(8).randrange(TINY_VOCAB) for _ in range(30)]
    config = GenerationConfig(max_new_tokens=6)
    engine.generate(a, config, drafter, cache_key="a")
    engine.generate(b, config, drafter, cache_key="b")
    drafter.forget("a")  # parked
    drafter.forget("b")  # live
    assert drafter.sessions.snapshot()["entries"] == 0 and drafter.cached_tokens() == []
    engine.generate(a + [3], config, drafter, cache_key="a")
    assert drafter.sessions.stats.reused_tokens == 0  # nothing of a was left to reuse


def bookkeeping(store: PrefixCache) -> dict[str, int]:
    """The size of every container the store keeps (entries, loans, anything it records)."""
    return {name: len(value) for name, value in vars(store).items() if isinstance(value, (dict, set, list))}


def test_a_loan_revoked_while_its_generation_raises_leaves_no_trace(target, draft):
    """A generation that raises never gives its cache back (as the soak test's injected fault does,
    at a stop check with the cache borrowed), and a document closed meanwhile revokes the loan,
    in the engine's store and in the draft model's live session. Nothing of either may stay: the
    store used to keep each revoked ticket until a ``put`` that never came. The next loan of the
    key is kept as usual."""
    store = PrefixCache(64 * MB)
    engine = SpeculativeEngine(loaded(target), prefix_cache=store)
    drafter = make_drafter("model", draft_model=loaded(draft), cost=engine.cost, session_cache_bytes=64 * MB)
    prompt = [random.Random(9).randrange(TINY_VOCAB) for _ in range(30)]
    config = GenerationConfig(max_new_tokens=8)

    def close_and_fail() -> bool:
        if store.snapshot()["lent"] == 1:  # the engine holds the cache, the drafter its session
            store.drop("doc")
            drafter.forget("doc")
            raise RuntimeError("injected: the decode fails with the cache borrowed")
        return False

    for _ in range(3):
        with pytest.raises(RuntimeError, match="injected"):
            engine.generate(prompt, config, drafter, cancel=close_and_fail, cache_key="doc")
    assert all(size == 0 for size in bookkeeping(store).values()), bookkeeping(store)
    assert all(size == 0 for size in bookkeeping(drafter.sessions).values()), bookkeeping(drafter.sessions)
    engine.generate(prompt, config, drafter, cache_key="doc")
    assert store.snapshot()["entries"] == 1 and store.snapshot()["lent"] == 0
