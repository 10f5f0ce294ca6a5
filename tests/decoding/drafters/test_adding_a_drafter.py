"""``docs/adding-a-drafter.md`` works as written: its drafter, saved where it says, and its two
edits, applied to the real ``speculative_complete/decoding/choices.py`` and
``speculative_complete/decoding/drafters/__init__.py``, give a drafter that ``make_drafter`` builds
by its new name and whose drafts the engine verifies, with output token for token plain greedy's.

The steps run in memory: the edited sources are executed as modules beside the real ones, and
nothing is written into the source tree.
"""

from __future__ import annotations

import random
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from tests.support.reference import plain_greedy
from tests.support.tiny_models import TINY_VOCAB, loaded, tiny_model

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "adding-a-drafter.md"
TOY_NAME = "repeat"
MAX_NEW = 40


@dataclass(frozen=True)
class Edit:
    """One hunk of a diff in the doc: ``before`` (context and removed lines) becomes ``after``
    (context and added lines)."""

    path: str
    before: str
    after: str


def saved_module() -> tuple[str, str]:
    """The doc's one ``Save this as `NAME` in `FOLDER`:`` code block: its path and its source."""
    found = re.findall(
        r"Save this as `([^`]+)` in `([^`]+)`:\s*\n```python\n(.*?)^```", DOC.read_text(), re.M | re.S
    )
    assert len(found) == 1, "the doc should save exactly one python block as a module"
    name, folder, source = found[0]
    return f"{folder.rstrip('/')}/{name}", source


def edits() -> list[Edit]:
    """The hunks of the doc's ``diff`` blocks, each naming its file in a ``+++ b/PATH`` line."""
    found = []
    for block in re.findall(r"^```diff\n(.*?)^```", DOC.read_text(), re.M | re.S):
        path = re.search(r"^\+\+\+ b/(\S+)$", block, re.M)
        assert path, "a diff block without its +++ b/PATH line"
        for hunk in re.split(r"^@@.*\n", block, flags=re.M)[1:]:
            lines = hunk.splitlines()
            before = [line[1:] for line in lines if line[:1] in (" ", "-")]
            after = [line[1:] for line in lines if line[:1] in (" ", "+")]
            found.append(Edit(path.group(1), "\n".join(before) + "\n", "\n".join(after) + "\n"))
    return found


def edited_source(path: str) -> str:
    """``path``'s real source with the doc's hunks for it applied; each must match once."""
    source = (ROOT / path).read_text()
    for edit in (e for e in edits() if e.path == path):
        assert source.count(edit.before) == 1, (
            f"the doc's edit of {path} no longer matches it:\n{edit.before}"
        )
        source = source.replace(edit.before, edit.after)
    return source


def module_from(name: str, source: str, path: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / path)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


@pytest.fixture
def registered(monkeypatch):
    """The doc's three steps: the drafter's module importable where it is saved, the name added,
    ``make_drafter`` edited. Returns (the drafter's module, choices, drafters) as edited."""
    path, source = saved_module()
    name = path.removesuffix(".py").replace("/", ".")
    toy = types.ModuleType(name)
    toy.__file__ = str(ROOT / path)
    monkeypatch.setitem(sys.modules, name, toy)  # what saving the file makes importable
    exec(compile(source, toy.__file__, "exec"), toy.__dict__)
    choices = module_from(
        "speculative_complete.decoding.choices",
        edited_source("speculative_complete/decoding/choices.py"),
        "speculative_complete/decoding/choices.py",
    )
    init = "speculative_complete/decoding/drafters/__init__.py"
    drafters = module_from("speculative_complete.decoding.drafters", edited_source(init), init)
    return toy, choices, drafters


def test_the_doc_edits_files_that_exist_and_saves_one_that_does_not():
    assert {edit.path for edit in edits()} == {
        "speculative_complete/decoding/choices.py",
        "speculative_complete/decoding/drafters/__init__.py",
    }
    path, _ = saved_module()
    assert path.startswith("speculative_complete/decoding/drafters/") and not (ROOT / path).exists()


def test_the_new_name_is_offered_and_built(registered):
    toy, choices, drafters = registered
    assert TOY_NAME in choices.DRAFTER_NAMES
    drafter = drafters.make_drafter(TOY_NAME, max_draft=4)
    assert type(drafter).__module__ == toy.__name__ and drafter.name == TOY_NAME
    assert drafters.make_drafter("ngram").name == "ngram"  # the others still built as before


def test_the_toy_drafter_is_verified_and_greedy_stays_exact(registered):
    _, _, drafters = registered
    target = tiny_model(13, logit_scale=20.0)  # sharp: greedy text that repeats, as code does
    engine = SpeculativeEngine(loaded(target))
    drafter = drafters.make_drafter(TOY_NAME, cost=engine.cost, max_draft=8)
    proposed = accepted = passes = 0
    for seed in range(6):
        rng = random.Random(seed)
        prompt = [rng.randrange(TINY_VOCAB) for _ in range(rng.randint(3, 12))]
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW), drafter)
        assert result.token_ids == plain_greedy(target, prompt, MAX_NEW), f"prompt {seed}"
        counts = result.stats.drafters[TOY_NAME]
        proposed, accepted = proposed + counts.proposed, accepted + counts.accepted
        passes += result.stats.target_passes
    assert 0 < accepted < proposed  # its drafts went to the target: some kept, some refused
    assert passes < 6 * MAX_NEW  # kept drafts saved target passes
