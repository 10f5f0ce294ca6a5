"""The pair benchmark's harness, run for real on the default model drafting for itself (the real
pair's files are large; where the real 0.5B and 1.5B are installed, they run too). Nothing here
is timed: what is checked is that every method of ours returns plain greedy's tokens and that the
report says so, and that a mismatch is reported and fails the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import real_models
from benchmarks.pair_bench import PromptRuns, Run, peer_run, peer_server, summarize
from speculative_complete.decoding.models.loading import default_gguf_path


def _run(tmp_path, target: str, draft: str) -> dict:
    out = tmp_path / "pair.json"
    argv = ["--target", target, "--draft", draft, "--prompts", "2", "--prompt-tokens", "96"]
    argv += ["--max-new-tokens", "12", "--repeats", "1", "--methods", "plain,ngram,model,auto"]
    # In a process of its own, as it is run: the models and the native kernels' threads it loads
    # stay out of this one, whose later tests time a server's answers.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.pair_bench", *argv, "--out", str(out)], timeout=600
    )
    assert done.returncode == 0
    return json.loads(out.read_text())


def test_every_drafter_of_ours_returns_plain_greedy_s_tokens_on_the_default_model(tmp_path):
    default = str(default_gguf_path())
    report = _run(tmp_path, default, default)
    summary = report["summary"]
    assert set(summary) == {"plain", "ngram", "model", "auto"}
    for method, row in summary.items():
        assert row["same_tokens_as_plain"] is True, method
        assert row["tokens"] > 0 and row["ms_per_token"] > 0, method
    assert len(report["prompts"]) == 2
    for prompt in report["prompts"]:
        assert prompt["prompt_tokens"] == 96
        plain = prompt["runs"]["plain"]["token_ids"]
        assert 0 < len(plain) <= 12
        assert all(run["token_ids"] == plain for run in prompt["runs"].values())


@pytest.mark.skipif(
    real_models.installed_path(real_models.TARGET) is None
    or real_models.installed_path(real_models.DRAFT) is None,
    reason="the real Qwen2.5-Coder pair is not installed (python -m benchmarks.real_models --install)",
)
def test_the_real_pair_s_drafts_keep_the_target_s_tokens(tmp_path):
    report = _run(tmp_path, real_models.TARGET, real_models.DRAFT)
    assert all(row["same_tokens_as_plain"] is True for row in report["summary"].values())


def test_a_method_whose_tokens_differ_from_plain_is_reported():
    record = PromptRuns("f.py", 1, 10)
    record.runs["plain"] = Run("plain", 3, 30.0, [1, 2, 3])
    record.runs["ngram"] = Run("ngram", 3, 15.0, [1, 2, 4])
    summary = summarize([record], ["plain", "ngram"])
    assert summary["plain"]["same_tokens_as_plain"] is True
    assert summary["ngram"]["same_tokens_as_plain"] is False
    assert summary["ngram"]["ms_per_token"] == 5.0 and summary["plain"]["ms_per_token"] == 10.0


def test_llama_server_with_the_draft_model_drafts():
    """The ``llama_md`` peer speculates: without ``--spec-type`` llama-server loads ``-md`` and
    decodes plain, and the benchmark would compare against a peer that never drafted."""
    model = default_gguf_path()
    ids = list(range(1000, 1064)) * 2  # a repeated run of tokens: drafts are kept
    with peer_server("llama_md", model, model) as server:
        run = peer_run(server, "llama_md", ids, 16)
    assert run.tokens > 0
    assert run.drafted and run.drafted > 0
    assert run.accepted and run.accepted > 0
