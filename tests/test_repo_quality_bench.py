"""A fast smoke run of ``benchmarks/repo_quality.py`` on a two-file project with the tiny random
model: the cases it picks (lines that use another file's name), both prompts, the JSON; not its
numbers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks import quality, repo_quality
from decoding import SpeculativeEngine, load_model
from lsp_server.context.builder import ContextBuilder, ContextRequest
from lsp_server.context.tokens import Tokens
from tests.lsp_helpers import tiny_model_dir, tokenizer_source

LIBRARY = (
    "".join(f"def settle_ledger_{i}(amount, rate):\n    return amount * rate + {i}\n\n\n" for i in range(4))
    + "class HarborClerk:\n    def tally(self, rows):\n        return len(rows)\n\n\nHARBOR_LIMIT = 40\n"
)
CALLER = (
    '"""Callers.\n\nsettle_ledger_0(docstring, not code)\n"""\nfrom library import settle_ledger_0\n\n\n'
    + "".join(f"def step_{i}(rows):\n    total = len(rows) * {i}\n    return total\n\n\n" for i in range(3))
    + "def run(rows):\n    value = settle_ledger_0(rows, 2)\n    clerk = HarborClerk()\n"
    + "    # settle_ledger_1(rows) in a comment\n    limit = HARBOR_LIMIT + 1\n    plain = rows + 1\n"
)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "harbor"
    root.mkdir()
    (root / "library.py").write_text(LIBRARY)
    (root / "caller.py").write_text(CALLER)
    return root


def test_cases_are_code_lines_that_use_another_files_name(tmp_path):
    root = project(tmp_path)
    texts, table = repo_quality.scan(root)
    cases = repo_quality.sample_cases("harbor", texts, table, 10, 0)
    assert sorted(c.expected for c in cases) == [
        "clerk = HarborClerk()",
        "limit = HARBOR_LIMIT + 1",
        "value = settle_ledger_0(rows, 2)",
    ]  # not the docstring's or the comment's mention, not the plain line, not the import
    case = next(c for c in cases if c.expected.startswith("value"))
    assert case.text[case.offset - 4 : case.offset] == "    " and case.text[case.offset] == "\n"
    # what the cross-file prompt adds: the definition, found through the import
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    uri = Path(case.file).as_uri()
    request = ContextRequest(case.text, case.offset, 512, uri=uri, language_id="python", symbols=table)
    (excerpt,) = ContextBuilder().build(request, tokens).snippets
    assert excerpt.kind == "definition" and excerpt.text.startswith("def settle_ledger_0(amount, rate):")
    assert not ContextBuilder().build(replace(request, cross_file=False), tokens).snippets
    assert repo_quality.definition_shown(tokens, 512, case, table)
    assert not repo_quality.definition_shown(tokens, 16, case, table)  # no room for definitions


def test_the_name_oracle_shows_the_definitions_of_the_lines_own_name_alone(tmp_path):
    root = project(tmp_path)
    texts, table = repo_quality.scan(root)
    cases = repo_quality.sample_cases("harbor", texts, table, 10, 0)
    case = next(c for c in cases if c.expected.startswith("limit"))
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    uri = Path(case.file).as_uri()
    request = ContextRequest(case.text, case.offset, 512, uri=uri, language_id="python", symbols=table)
    shipped = {s.text.split("\n")[0] for s in ContextBuilder().build(request, tokens).snippets}
    assert "def settle_ledger_0(amount, rate):" in shipped  # the names near the cursor's
    builder, oracle = ContextBuilder(), repo_quality.NameOracle()
    builder.definitions = oracle
    oracle.name = repo_quality.cross_file_name(case.expected, Path(case.file), table) or ""
    (excerpt,) = builder.build(request, tokens).snippets
    assert oracle.name == "HARBOR_LIMIT" and excerpt.text == "HARBOR_LIMIT = 40"


def test_the_benchmark_runs_end_to_end_on_a_tiny_project(tmp_path):
    out = tmp_path / "repo_quality.json"
    result = repo_quality.main(
        [
            f"--projects={project(tmp_path)}",
            "--n=3",
            "--budget=128",
            "--max-new-tokens=4",
            "--keystroke-lines=1",
            f"--model={tiny_model_dir()}",
            "--cost-model=none",
            "--oracle",
            f"--out={out}",
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    row = saved["summary"]["all"]
    assert row["n"] == 3 and saved["summary"]["harbor"]["n"] == 3
    assert 0.0 <= saved["definition_shown"] <= 1.0
    for variant in (*repo_quality.VARIANTS, repo_quality.ORACLE):
        assert 0.0 <= row[variant]["exact"] <= 1.0 and 0 < row[variant]["prompt_tokens_mean"] <= 128
        assert row[variant]["line_log_prob"] < 0.0
    assert 0.0 <= row["log_prob_raised"] <= 1.0
    case = saved["cases"][0]["runs"]
    assert set(case) == {*repo_quality.VARIANTS, repo_quality.ORACLE}
    assert all(run["line_log_prob"] < 0.0 for run in case.values())
    share = saved["keystroke_prefix_share"]
    assert 0.5 < share["single_file"] <= 1.0 and 0.5 < share["cross_file"] <= 1.0


def test_the_line_log_prob_is_the_models_own_teacher_forced_mean():
    """Against transformers' forward over the prompt and the line in one pass: what the line's
    tokens score, from the first one past the text healing backed up over."""
    model_dir = tiny_model_dir()
    engine = SpeculativeEngine(load_model(str(model_dir), device="cpu", dtype="float32"))
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cases = (
        ("def run(rows):\n    value =", "", " settle_ledger(rows, 2)\n"),
        ("def run(rows):\n", "   ", "    value = settle(rows)\n"),  # its first token: the 3 spaces
    )
    for before, healed, line in cases:
        prompt, ids = engine.encode(before), engine.encode(line)
        with torch.inference_mode():
            logits = reference(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        picked = torch.log_softmax(logits.float(), -1)[torch.arange(len(ids)), torch.tensor(ids)]
        owed = 1 if healed and engine.decode(ids[:1]) == healed else 0
        got = quality.line_log_prob(engine, prompt, healed, line[len(healed) :].rstrip("\n"))
        assert abs(got - float(picked[owed:].mean())) < 1e-3
        assert owed == (healed != "")
