"""The real pair: Qwen2.5-Coder-1.5B as the target, its 0.5B as the draft (one vocabulary).

Speculative greedy output must be token for token the target's own on real weights too, with every
drafter as shipped (``none``, ``ngram``, ``model``, ``auto``), on plain prompts, an infilling prompt
and a healed one (the cursor inside a word). Small enough for CI: a few short prompts, since a
step of the 1.5B costs tens of milliseconds on two cores.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from speculative_complete.decoding.drafters import make_drafter
from speculative_complete.decoding.engine.healing import back_up
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine

pytestmark = pytest.mark.real_model

STDLIB = Path(sysconfig.get_paths()["stdlib"])
DRAFTERS = ("ngram", "model", "auto")


def code_prompts() -> list[str]:
    """Real code cut after a line's indentation, and an infilling prompt in Qwen's own markers."""
    shlex = (STDLIB / "shlex.py").read_text()
    cut = shlex.index("            elif self.state == ' ':")
    heapq = (STDLIB / "heapq.py").read_text()
    at = heapq.index("def heappushpop(heap, item):")
    fim = (
        "<|fim_prefix|>def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return <|fim_suffix|>\n\n\nprint(mean([1, 2, 3]))\n<|fim_middle|>"
    )
    return [shlex[cut - 900 : cut + 12], heapq[at - 600 : at + 60], fim]


@pytest.fixture(scope="module")
def engine(real_target):
    return SpeculativeEngine(real_target)


@pytest.fixture(scope="module")
def drafters(engine, real_target, real_draft):
    return {
        name: make_drafter(
            name, draft_model=real_draft, cost=engine.cost, target_vocab=real_target.vocab_size
        )
        for name in DRAFTERS
    }


def test_every_drafter_reproduces_plain_greedy_on_the_real_pair(engine, drafters):
    config = GenerationConfig(max_new_tokens=24)
    proposed = dict.fromkeys(drafters, 0)
    for prompt in code_prompts():
        ids = engine.encode(prompt)
        plain = engine.generate(ids, config)
        assert plain.stats.tokens_per_pass == 1.0 and plain.token_ids
        for name, drafter in drafters.items():
            result = engine.generate(ids, config, drafter)
            assert result.token_ids == plain.token_ids, f"{name} differs on {prompt[-60:]!r}"
            assert result.text == plain.text and result.stop_reason == plain.stop_reason
            proposed[name] += sum(s.proposed for s in result.stats.drafters.values())
    assert proposed["model"] > 0 and proposed["ngram"] > 0
    # The infilling prompt's middle ends at <|endoftext|>: the engine stops there for every drafter.
    assert plain.stop_reason == "eos" and "<|" not in plain.text


def test_every_drafter_reproduces_plain_greedy_inside_a_healed_word(engine, drafters):
    """The cursor inside a word: healing backs the prompt up over its last token and the answer
    must spell it out again; the first token is constrained, every drafter must agree."""
    source = (STDLIB / "textwrap.py").read_text()
    cursor = source.index("self.expand_tabs = expand_tabs") + len("self.expand_ta")
    text = source[cursor - 1200 : cursor]
    cut = back_up(engine.encode(text), text, engine.decode, engine.healing_index)
    assert cut.removed  # the prompt was backed up
    config = GenerationConfig(max_new_tokens=16, stop_at_newline=True, required_prefix=cut.removed)
    plain = engine.generate(cut.ids, config)
    assert plain.text.startswith("bs = expand_tabs")  # the word's rest, then the line
    for name, drafter in drafters.items():
        result = engine.generate(cut.ids, config, drafter)
        assert result.token_ids == plain.token_ids, name
        assert result.text == plain.text
