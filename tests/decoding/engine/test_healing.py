"""Token healing: the pure helpers, the engine hook's exactness on tiny models, and the two cases
that motivated it on the real model.

The tiny models use a tokenizer of multi-character pieces (``PieceTokenizer``), because healing is
only interesting where one text has several tokenizations ("ab" + "c" or "abc").
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from transformers import DynamicCache

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.healing import (
    BLANK,
    HealingIndex,
    PrefixConstraint,
    back_up,
    token_bytes_table,
)
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from tests.support.tiny_models import loaded, tiny_model

PIECES = [
    "\n",
    " ",
    "  ",
    "    ",
    "\n    ",
    "\n  ",
    "a",
    "ab",
    "abc",
    "abcd",
    "b",
    "bc",
    "c",
    "d",
    "de",
    "def",
    "e",
    "f",
    "x",
    "xy",
    "y",
    "z",
    "(",
    ")",
    "()",
    "):",
    ":",
    "=",
    " =",
    " x",
    " a",
    " ab",
    "é",
    "ü",
    "_",
    "_a",
    "1",
    "2",
    "12",
    ",",
    ", ",
    ".",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
    "n",
    "o",
    "p",
    "q",
    "r",
    "s",
    "t",
    "u",
    "v",
    "w",
    "\t",
    "\t\t",
    "[",
    "]",
    '"',
    "'",
]


class PieceTokenizer:
    """Token i is ``PIECES[i]``; encoding is greedy longest match. Enough for the engine."""

    bos_token_id = None
    eos_token_id = None

    def __init__(self, pieces: list[str] = PIECES) -> None:
        self.pieces = pieces
        self.longest = max(map(len, pieces))
        self.ids = {p: i for i, p in enumerate(pieces)}

    def __len__(self) -> int:
        return len(self.pieces)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.ids)

    added_tokens_decoder: ClassVar[dict] = {}  # no special tokens

    def decode(self, tokens, skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[int(t)] for t in tokens)

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), 0, -1):
                if text[i : i + n] in self.ids:
                    ids.append(self.ids[text[i : i + n]])
                    i += n
                    break
            else:
                raise ValueError(f"cannot encode {text[i]!r}")
        return {"input_ids": ids}


TOK = PieceTokenizer()
VOCAB = len(PIECES)


def ids(*pieces: str) -> list[int]:
    return [TOK.ids[p] for p in pieces]


# -- pure helpers -----------------------------------------------------------------------------------


def test_the_generic_table_is_each_pieces_bytes():
    table = token_bytes_table(TOK, VOCAB + 3)  # a model's padded rows map to None
    assert table[:VOCAB] == [p.encode() for p in PIECES] and table[VOCAB:] == [None] * 3


def prefix_compatible(token: bytes, remaining: bytes) -> bool:
    """The oracle ``HealingIndex.allowed`` is checked against, written the plain way: a token may
    come next while ``remaining`` is owed where one is a prefix of the other, and past a final
    whitespace character of ``remaining`` it must not go on with another one."""
    if not token:
        return False
    if remaining.startswith(token):
        return True
    if not token.startswith(remaining):
        return False
    return not (remaining[-1:] in BLANK and token[len(remaining) : len(remaining) + 1] in BLANK)


def test_allowed_tokens_are_exactly_the_prefix_compatible_ones():
    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    for remaining in ["ab", "a", "abcde", "\n   ", "\n    x", " ", "é", "zz", ")"]:
        want = tuple(i for i, p in enumerate(PIECES) if prefix_compatible(p.encode(), remaining.encode()))
        assert index.allowed(remaining.encode()) == want, remaining
    assert set(index.allowed(b"ab")) == set(ids("a", "ab", "abc", "abcd"))
    assert index.allowed(b"") == ()
    # Past the user's final space or indentation, no more whitespace: "\n  " may not become "\n    ".
    assert set(index.allowed(b"\n  ")) == set(ids("\n", "\n  "))
    assert TOK.ids[" x"] in index.allowed(b" ") and TOK.ids["  "] not in index.allowed(b" ")


def test_a_constraint_tracks_what_is_still_owed():
    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    c = PrefixConstraint(index, "abc")
    assert c.active and set(c.allowed()) == set(ids("a", "ab", "abc", "abcd"))
    c.advance(TOK.ids["ab"])
    assert c.active and set(c.allowed()) == set(ids("c"))
    c.advance(TOK.ids["c"])
    assert not c.active and c.allowed() == ()
    # Required text ending in whitespace: the token after it must not start with more.
    c = PrefixConstraint(index, "x ")
    c.advance(TOK.ids["x"])
    c.advance(TOK.ids[" "])
    assert c.active and set(c.allowed()) == {i for i, p in enumerate(PIECES) if p[0] not in " \t\n"}
    c.advance(TOK.ids["a"])
    assert not c.active


def test_back_up_removes_the_last_token_and_reports_its_text():
    text = "x = ab"
    prompt = TOK(text)["input_ids"]
    assert prompt == ids("x", " =", " ab")
    got = back_up(prompt, text, TOK.decode)
    assert got.ids == ids("x", " =") and got.removed == " ab"
    assert back_up([], "", TOK.decode).removed == ""


def test_back_up_steps_over_a_character_split_between_tokens(default_model):
    tok = default_model.tokenizer
    text = "name = '日"  # the CJK character's 3 bytes: how SmolLM2 splits them decides the cut
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    got = back_up(prompt, text, lambda t: tok.decode(list(t)))
    assert got.removed and text.endswith(got.removed) and "\ufffd" not in got.removed
    assert tok.decode(got.ids) + got.removed == text


def test_back_up_leaves_special_or_unknown_last_tokens_alone():
    index = HealingIndex([b"a", None])
    assert back_up([0, 1], "a", lambda t: "a" * len(t), index).removed == ""


def test_the_byte_level_table_of_the_real_tokenizer_matches_decode(default_model):
    tok = default_model.tokenizer
    table = token_bytes_table(tok, default_model.vocab_size)
    assert len(table) == default_model.vocab_size
    newline_indent = tok("x\n    ", add_special_tokens=False)["input_ids"][-1]
    assert table[newline_indent] == b"\n    "
    for i in range(0, len(table), 97):
        text = tok.decode([i])
        if table[i] is not None and "\ufffd" not in text:
            assert table[i] == text.encode("utf-8"), i
    special = tok.convert_tokens_to_ids("<|im_start|>")
    assert table[special] is None
    # Multi-byte characters split between tokens: the bytes still concatenate exactly.
    sample = "café 日本語 ü"
    pieces = tok(sample, add_special_tokens=False)["input_ids"]
    assert b"".join(table[i] for i in pieces) == sample.encode("utf-8")


# -- the engine hook on tiny models --------------------------------------------------------------------


@torch.inference_mode()
def masked_greedy(model, index: HealingIndex, prompt: list[int], required: str, max_new: int) -> list[int]:
    """The reference: plain greedy, one token per pass, logits masked while the text is owed."""
    cache = DynamicCache(config=model.config)
    constraint = PrefixConstraint(index, required)
    logits = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0, -1]
    out: list[int] = []
    for _ in range(max_new):
        if constraint.active:
            mask = torch.full_like(logits, float("-inf"))
            allowed = torch.tensor(constraint.allowed())
            mask[allowed] = logits[allowed]
            logits = mask
        token = int(logits.argmax())
        constraint.advance(token)
        out.append(token)
        logits = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
    return out


@pytest.fixture(scope="module")
def tiny_targets():
    return [
        tiny_model(seed, layers=2, vocab_size=VOCAB, logit_scale=scale)
        for seed, scale in [(21, 1.0), (22, 10.0), (23, 30.0)]
    ]


REQUIRED = ["ab", "abc", "\n    ", "\n   ", " ", "é", "xy(", "de", "  ", "_a", "\t"]


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "auto", "model"])
def test_healed_greedy_equals_masked_plain_greedy(tiny_targets, drafter_name):
    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    rng = random.Random(drafter_name)
    drafted = 0
    for case in range(60):
        target = tiny_targets[case % len(tiny_targets)]
        motif = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
        prompt = (motif * rng.randint(1, 4))[: rng.randint(1, 20)]
        required = rng.choice(REQUIRED)
        max_new = rng.randint(1, 30)
        want = masked_greedy(target, index, prompt, required, max_new)
        engine = SpeculativeEngine(loaded(target, TOK))
        drafter = make_drafter(
            drafter_name,
            draft_model=loaded(tiny_targets[(case + 1) % 3], TOK),
            cost=engine.cost,
            max_draft=rng.choice([2, 4, 8]),
        )
        result = engine.generate(
            prompt, GenerationConfig(max_new_tokens=max_new, required_prefix=required), drafter
        )
        assert result.token_ids == want, f"case {case}"
        full = TOK.decode(want)
        if len(full) >= len(required):
            assert full.startswith(required) and result.text == full[len(required) :]
        else:
            assert required.startswith(full) and result.text == ""
        drafted += sum(s.proposed for s in result.stats.drafters.values())
    if drafter_name != "none":
        assert drafted > 0  # speculation resumed once the required text was produced


def test_drafts_are_verified_while_text_is_owed_and_stay_exact(tiny_targets):
    """A greedy draft rides on the prefill and on later passes while the required text is still
    owed: each row is masked as one masked step at a time would be, so the output is masked
    greedy's, and a draft that spells the owed text is kept (here the target drafts for itself,
    and the owed text is what its own next tokens write, sometimes with a wrong character)."""
    from tests.support.reference import plain_greedy

    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    rng = random.Random(11)
    rode = 0
    for case in range(45):
        target = tiny_targets[case % len(tiny_targets)]
        engine = SpeculativeEngine(loaded(target, TOK))
        drafter = make_drafter("model", draft_model=loaded(target, TOK), cost=engine.cost, max_draft=4)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 10))]
        own = plain_greedy(target, prompt, 6)
        required = TOK.decode(own[: rng.randint(1, 3)])
        if rng.random() < 0.3:
            required = required[:-1] + rng.choice("ab (")
        want = masked_greedy(target, index, prompt, required, 8)
        config = GenerationConfig(max_new_tokens=8, required_prefix=required)
        result = engine.generate(prompt, config, drafter)
        assert result.token_ids == want, f"case {case}"
        rode += result.stats.prefill_tokens > 1
    assert rode > 10
    target = tiny_targets[1]
    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    prompt = ids("a", "b", "c", "\n    ", "x")
    want = masked_greedy(target, index, prompt, "\n    ", 20)
    full = TOK.decode(want)
    engine = SpeculativeEngine(loaded(target, TOK))
    result = engine.generate(
        prompt,
        GenerationConfig(max_new_tokens=20, required_prefix="\n    ", stop_at_newline=True),
        make_drafter("ngram"),
    )
    body = full[len("\n    ") :]
    assert result.text == body.split("\n", 1)[0]  # the required "\n" did not stop it
    assert TOK.decode(result.token_ids).startswith("\n    ")


def test_stop_when_cuts_where_the_caller_says(tiny_targets):
    target = tiny_targets[0]
    engine = SpeculativeEngine(loaded(target, TOK))
    plain = engine.generate(ids("a", "b"), GenerationConfig(max_new_tokens=20))
    assert len(plain.text) > 4
    result = engine.generate(
        ids("a", "b"), GenerationConfig(max_new_tokens=20, stop_when=lambda t: 3 if len(t) >= 3 else None)
    )
    assert result.text == plain.text[:3] and result.stop_reason == "stop"
    assert len(result.token_ids) <= len(plain.token_ids)


def test_nothing_can_continue_the_required_text():
    target = tiny_model(5, vocab_size=VOCAB)
    engine = SpeculativeEngine(loaded(target, TOK))
    result = engine.generate(ids("a"), GenerationConfig(max_new_tokens=5, required_prefix="Ω"))
    assert result.text == "" and result.token_ids == [] and result.stop_reason == "stop"


def test_sampling_with_a_required_prefix_starts_with_it(tiny_targets):
    engine = SpeculativeEngine(loaded(tiny_targets[0], TOK))
    for seed in range(10):
        config = GenerationConfig(max_new_tokens=10, required_prefix="abc", temperature=1.0, seed=seed)
        result = engine.generate(ids("x"), config, make_drafter("ngram"))
        assert TOK.decode(result.token_ids).startswith("abc")


# -- the real model -------------------------------------------------------------------------------------

ENCODER = Path(sysconfig.get_paths()["stdlib"]) / "json" / "encoder.py"


def healed(engine: SpeculativeEngine, text: str, **kwargs) -> tuple[str, str]:
    """(plain, healed) completions of ``text``, both as the text that follows it."""
    config = GenerationConfig(max_new_tokens=12, stop_at_newline=True, **kwargs)
    plain = engine.generate(engine.encode(text), config).text
    cut = back_up(engine.encode(text), text, engine.decode, engine.healing_index)
    config.required_prefix = cut.removed
    return plain, engine.generate(cut.ids, config).text


@pytest.mark.real_model
def test_mid_word_healing_keeps_the_rest_of_the_word(default_model):
    source = ENCODER.read_text()
    cursor = source.index("yield from _iterencode_dict(o, _current_indent_level)") + len(
        "yield from _iterencode_dic"
    )
    engine = SpeculativeEngine(default_model)
    plain, healed_text = healed(engine, source[max(0, cursor - 1500) : cursor])
    assert plain.startswith("(o,")  # the slip: the "t" of "dict" is lost
    assert healed_text.startswith("t(o, _current_indent_level)")


@pytest.mark.real_model
def test_after_indentation_healing_writes_the_next_statement(default_model):
    engine = SpeculativeEngine(default_model)
    text = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        "
    plain, healed_text = healed(engine, text)
    assert not plain.strip()  # the slip: an empty line
    assert healed_text == "self.y = y"


# -- healing with the per-document prefix cache -----------------------------------------------------------


def test_healing_and_the_prefix_cache_stay_exact(tiny_targets):
    """Known greedy continuations serve a healed prompt only where they spell the required text,
    and a token healing forced never enters the greedy chain that later requests reuse."""
    from speculative_complete.decoding.kv_cache import PrefixCache
    from tests.support.reference import plain_greedy

    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    rng = random.Random(5)
    used_known = 0
    for case in range(40):
        target = tiny_targets[case % len(tiny_targets)]
        engine = SpeculativeEngine(loaded(target, TOK), prefix_cache=PrefixCache(1 << 26))
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))]
        first = engine.generate(prompt, GenerationConfig(max_new_tokens=12), cache_key="doc")
        assert first.token_ids == plain_greedy(target, prompt, 12)
        # A healed prompt on the chain: the chain's next token's text, or something else.
        chain = prompt + first.token_ids
        cut = rng.randint(len(prompt), len(chain) - 2)
        required = TOK.pieces[chain[cut]] if rng.random() < 0.5 else rng.choice(REQUIRED)
        want = masked_greedy(target, index, chain[:cut], required, 10)
        healed = engine.generate(
            chain[:cut], GenerationConfig(max_new_tokens=10, required_prefix=required), cache_key="doc"
        )
        assert healed.token_ids == want, f"case {case}"
        used_known += healed.stats.known_tokens > 0
        # Whatever healing forced is not replayed as the model's own greedy choice.
        again = engine.generate(chain[:cut], GenerationConfig(max_new_tokens=10), cache_key="doc")
        assert again.token_ids == plain_greedy(target, chain[:cut], 10), f"case {case}"
    assert used_known > 0


def test_typing_on_inside_a_healed_word_answers_from_the_last_answer_exactly(tiny_targets):
    """The same prompt asked again with more of the word typed (healing owes a longer text) is
    answered from what was decoded for the shorter text, with no pass, wherever that is what
    healing the longer text decodes; and always exactly that, after a deletion too."""
    from speculative_complete.decoding.kv_cache import PrefixCache
    from tests.support.reference import plain_greedy

    index = HealingIndex(token_bytes_table(TOK, VOCAB))
    rng = random.Random(7)
    served = 0
    for case in range(60):
        target = tiny_targets[case % len(tiny_targets)]
        engine = SpeculativeEngine(loaded(target, TOK), prefix_cache=PrefixCache(1 << 26))
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))]
        owed = rng.choice(REQUIRED)
        config = GenerationConfig(max_new_tokens=10, required_prefix=owed)
        first = engine.generate(prompt, config, cache_key="doc")
        assert first.token_ids == masked_greedy(target, index, prompt, owed, 10), f"case {case}"
        written = TOK.decode(first.token_ids)
        for _ in range(3):  # the user types on (what was suggested, or not), or deletes
            move = rng.random()
            if move < 0.2 and len(owed) > 1:
                owed = owed[:-1]
            else:
                typed = written[len(owed) : len(owed) + 1] if move < 0.8 else rng.choice("ab (\n")
                if not typed:
                    break
                owed += typed
            config = GenerationConfig(max_new_tokens=10, required_prefix=owed)
            again = engine.generate(prompt, config, cache_key="doc")
            assert again.token_ids == masked_greedy(target, index, prompt, owed, 10), f"case {case}"
            if again.stats.target_passes == 0:
                served += 1
                assert again.stats.known_tokens > 0
        # Nothing healing forced is replayed as the model's own greedy choice.
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=10), cache_key="doc")
        assert plain.token_ids == plain_greedy(target, prompt, 10), f"case {case}"
    assert served > 10
