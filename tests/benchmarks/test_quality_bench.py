"""A fast smoke run of ``benchmarks/quality.py`` on a tiny corpus with the tiny random model:
the benchmark's plumbing (sampling, both prompts, scoring, the keystroke share, the JSON), not
its numbers."""

from __future__ import annotations

import json

from benchmarks import quality
from benchmarks.naive_context import fit_tokens, plain_window
from speculative_complete.lsp_server.context.builder import ContextRequest
from speculative_complete.lsp_server.context.text import MAX_CHARS_PER_TOKEN
from tests.support.lsp import tiny_model_dir

PYTHON = "".join(
    f"def handler_{i}(request, response):\n    response.status = request.code + {i}\n"
    f"    return response.render(template='page_{i}.html')\n\n\n"
    for i in range(12)
)
JAVASCRIPT = "".join(
    f"function handler{i} (request, response) {{\n  response.status = request.code + {i}\n"
    f"  return response.render('page{i}.html')\n}}\n\n"
    for i in range(12)
)
C = "#include <stdio.h>\n\n" + "".join(
    f"static int handler_{i}(struct request *request)\n{{\n"
    f"    return request->code + {i} * request->weight;\n}}\n\n"
    for i in range(12)
)


def test_the_quality_benchmark_runs_end_to_end_on_a_tiny_corpus(tmp_path):
    roots = {}
    for lang, name, text in [
        ("python", "app.py", PYTHON),
        ("javascript", "app.js", JAVASCRIPT),
        ("c", "app.c", C),
    ]:
        folder = tmp_path / lang
        folder.mkdir()
        (folder / name).write_text(text)
        roots[lang] = folder
    out = tmp_path / "quality.json"
    result = quality.main(
        [
            "--n",
            "2",
            "--budget",
            "96",
            "--max-new-tokens",
            "4",
            "--keystroke-lines",
            "1",
            "--model",
            str(tiny_model_dir()),
            "--out",
            str(out),
            *[f"--root={lang}={folder}" for lang, folder in roots.items()],
        ]
    )
    saved = json.loads(out.read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    for lang in ("python", "javascript", "c", "all"):
        row = saved["summary"][lang]
        assert row["n"] == (6 if lang == "all" else 2)
        for variant in ("naive", "context"):
            assert 0.0 <= row[variant]["exact"] <= 1.0 and 0.0 <= row[variant]["edit_similarity"] <= 1.0
            assert 0 < row[variant]["prompt_tokens_mean"] <= 96
    case = saved["cases"][0]
    assert set(case["runs"]) == {"naive", "context"} and case["expected"].strip()
    share = saved["keystroke_prefix_share"]
    assert share["keystrokes"] > 10 and 0.5 < share["context"] <= 1.0 and 0.0 <= share["naive"] <= 1.0


def test_edit_similarity():
    assert quality.edit_similarity("abc", "abc") == 1.0 and quality.edit_similarity("", "") == 1.0
    assert quality.edit_similarity("abd", "abc") == 1 - 1 / 3 and quality.edit_similarity("", "xy") == 0.0
    assert quality.levenshtein("kitten", "sitting") == 3


# -- the naive baseline ----------------------------------------------------------------------------


def test_the_window_is_the_text_before_the_cursor_starting_at_a_line_when_cut():
    text = "".join(f"line {i}\n" for i in range(1000)) + "tail"
    prompt = plain_window(ContextRequest(text=text, offset=len(text), budget_tokens=10))
    assert prompt.text.endswith("tail") and len(prompt.text) <= 10 * MAX_CHARS_PER_TOKEN
    assert prompt.text.startswith("line ") and text[prompt.start - 1] == "\n"
    short = plain_window(ContextRequest(text="x = 1\ny", offset=7, budget_tokens=100))
    assert short.text == "x = 1\ny" and short.start == 0


def test_lone_surrogates_do_not_reach_the_tokenizer():
    prompt = plain_window(ContextRequest("s = '\ud800'", 10, 100))
    assert prompt.text == "s = '?'"  # a surrogate the client split is replaced, the rest kept
    assert prompt.text.encode("utf-8") == b"s = '?'"


def test_fit_tokens_keeps_the_end_within_the_budget():
    def encode(text: str) -> list[int]:  # one token per character
        return [ord(c) for c in text]

    text = "".join(f"row {i}\n" for i in range(500)) + "end"
    ids = fit_tokens(text, encode, 100)
    assert len(ids) <= 100 and "".join(map(chr, ids)).endswith("end")
    assert "".join(map(chr, ids)).startswith("row ")  # re-cut at a line start
    assert fit_tokens("short", encode, 100) == encode("short")
