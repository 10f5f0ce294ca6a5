"""Greedy choices come from the exact output layer, never from its approximations.

The lean forward's output layer ranks tokens on the 4-bit kernel and recomputes only its
candidates exactly (``QuantizedOutputLayer``). These tests hold its greedy choices against the GGUF's
own output layer (its blocks dequantized by the gguf package, as llama.cpp reads them), applied
to the forward's own final hidden states: unconstrained, and under token healing, where only
the tokens that spell the owed text may be chosen and none of them may be among the candidates
(a rare typed prefix, non-ASCII, punctuation).
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from speculative_complete.decoding.drafters import load_head_drafter, make_drafter
from speculative_complete.decoding.engine.healing import PrefixConstraint
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.models.loading import default_gguf_path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ["argparse.py", "json/decoder.py", "textwrap.py", "shlex.py", "fractions.py", "csv.py", "inspect.py"]
# Owed texts no candidate of the unconstrained ranking spells: rare prefixes, non-ASCII, punctuation.
RARE = [
    "zz",
    "é",
    "#",
    "ü",
    "λ",
    "->",
    "§",
    "qx",
    "Ω",
    "€",
    "ß",
    "~",
    "@",
    "`",
    "Zq",
    "ñ",
    "0x",
    "¿",
    "→",
    "%%",
]


@pytest.fixture(scope="module")
def exact_output() -> torch.Tensor:
    """The GGUF's output layer (the tied embedding table), dequantized by the gguf package."""
    from gguf import GGUFReader, quants

    reader = GGUFReader(str(default_gguf_path()))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    return torch.from_numpy(rows.reshape(int(tensor.shape[1]), int(tensor.shape[0])))


def healing_cases(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(text before the cursor, text owed): cuts of real code inside a word or after a symbol,
    and the same contexts owing a rare text; two found by hand where the approximation erred."""
    rng = random.Random(seed)
    cases = [
        ("def fibonacci(n):\n    ", "zz"),
        ("class Point:\n    def norm(self):\n        return self.", "é"),
    ]
    while len(cases) < count:
        text = (STDLIB / FILES[len(cases) % len(FILES)]).read_text()
        cut = rng.randrange(400, len(text) - 8)
        owed = text[cut : cut + rng.randint(1, 3)]
        if not owed.strip() or "\n" in owed:
            continue
        context = text[max(0, cut - 300) : cut]
        cases.append((context, owed if len(cases) % 3 else rng.choice(RARE)))
    return cases


def exact_choices(engine, exact_output, prompt: list[int], generated: list[int], owed: str) -> list[int]:
    """What the exact output layer chooses at each generated position while ``owed`` is owed:
    the argmax over the allowed tokens of its logits for the forward's own hidden states."""
    forward, index = engine.target.forward, engine.healing_index
    cache = forward.new_cache()
    forward(prompt + generated, cache, keep=1)
    probe, choices = PrefixConstraint(index, owed), []
    for j, token in enumerate(generated):
        if not probe.active:
            break
        allowed = torch.tensor(probe.allowed())
        logits = exact_output[allowed] @ cache.hidden[len(prompt) - 1 + j]
        choices.append(int(allowed[int(logits.argmax())]))
        probe.advance(token)
    return choices


@pytest.mark.real_model
@pytest.mark.parametrize("drafter_name", ["none", "auto"])
def test_healed_greedy_choices_are_the_exact_output_layers(default_model, exact_output, drafter_name):
    """Healed prompts (a third owing a rare text), 200 plain and 100 with the shipped ``auto``
    drafter (its n-gram source and the shipped head, confident as shipped): every token chosen
    while text is owed is the exact layer's best allowed one."""
    engine = SpeculativeEngine(default_model)
    drafter = None
    if drafter_name == "auto":
        head = load_head_drafter(default_model, "auto", cost=engine.cost)
        drafter = make_drafter("auto", draft_head=head, cost=engine.cost)
    checked = 0
    for i, (context, owed) in enumerate(healing_cases(200 if drafter is None else 100)):
        prompt = engine.encode(context)
        config = GenerationConfig(max_new_tokens=4, required_prefix=owed)
        result = engine.generate(prompt, config, drafter)
        generated = result.token_ids
        want = exact_choices(engine, exact_output, prompt, generated, owed)
        assert generated[: len(want)] == want, f"case {i}: {context[-40:]!r} owing {owed!r}"
        checked += len(want)
    assert checked >= 100


@pytest.mark.real_model
def test_unconstrained_greedy_choices_are_the_exact_output_layers_even_with_few_candidates(
    default_model, exact_output
):
    """With a handful of candidates the true best token is often outside them: the layer's error
    bound finds it and computes it exactly, so the argmax is the exact layer's on every row."""
    forward = default_model.forward
    head = forward.output_layer
    text = (STDLIB / "argparse.py").read_text()[:6000]
    tokens = default_model.tokenizer(text, add_special_tokens=False)["input_ids"][:600]
    cache = forward.new_cache()
    forward(tokens, cache, keep=1)
    hidden = cache.hidden[: len(tokens)]
    want = (hidden @ exact_output.T).argmax(-1)
    saved = head.GREEDY_CANDIDATES, head.repaired
    try:
        head.GREEDY_CANDIDATES = 2
        got = head(hidden, greedy_only=True).argmax(-1)
        repaired = head.repaired - saved[1]
    finally:
        head.GREEDY_CANDIDATES = saved[0]
    assert torch.equal(got, want)
    assert repaired > 0  # the bound did find tokens outside the two candidates
