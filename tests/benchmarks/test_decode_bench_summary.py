"""decode_bench's summary arithmetic on hand-made records: the benchmark itself needs the real
model and minutes, so its figures are checked here on records whose answers are known."""

from __future__ import annotations

import pytest

from benchmarks.decode_bench import MethodRun, PromptRecord, summarize


def run(method: str, produced: int, passes: int, prefill_tokens: int) -> MethodRun:
    return MethodRun(
        method=method,
        total_ms=10.0 * passes,
        decode_ms=10.0 * (passes - 1),
        prefill_ms=10.0,
        engine_decode_ms=10.0 * (passes - 1),
        produced_tokens=produced,
        matches_plain=True,
        stop_reason="stop",
        target_passes=passes,
        tokens_per_pass=produced / passes,
        after_prefill=(produced - prefill_tokens, passes - 1),
    )


def record(index: int, *runs: MethodRun) -> PromptRecord:
    rec = PromptRecord("cold", index, "a.py", index, 0, "", 100, "", "", "", True)
    rec.runs = {r.method: r for r in runs}
    return rec


def test_tokens_per_pass_after_the_prefill_is_summed_over_prompts_not_averaged():
    records = [
        record(0, run("plain", 9, 9, 1), run("auto", 9, 2, 5)),  # 4 tokens in 1 pass after it
        record(1, run("plain", 11, 11, 1), run("auto", 11, 6, 1)),  # 10 tokens in 5 passes
    ]
    summary = summarize(records, ["plain", "auto"])
    assert summary["plain"]["tokens_per_pass_after_prefill"] == 1.0
    # (4 + 10) / (1 + 5), where the mean of the per-prompt ratios would be (4 + 2) / 2
    assert summary["auto"]["tokens_per_pass_after_prefill"] == 14 / 6
    assert summary["auto"]["tokens_per_pass_mean"] == (9 / 2 + 11 / 6) / 2


@pytest.mark.real_model
def test_heal_decodes_the_prompt_backed_up_as_the_server_does_and_every_method_matches_plain(default_model):
    """``--heal``: each prompt is backed up to a token boundary, the removed text becomes what
    every output must begin with, and the engine methods still write plain greedy's tokens."""
    from benchmarks.decode_bench import Bench, Prompt

    text = "import math\n\n\nclass Point:\n    def norm(self):\n        return math.hypot(self.x, self.va"
    bench = Bench(default_model, None, max_new_tokens=8, peers=False, heal=True)
    ids = bench.engine.encode(text)
    prompt = Prompt("cold", "a.py", 6, 32, "mid_line", ids, "lue)")
    healed = bench.healed(prompt)
    removed = bench.config.required_prefix
    assert removed and text.endswith(removed) and ids[: len(healed.token_ids)] == healed.token_ids
    assert bench.engine.decode(healed.token_ids) + removed == text
    plain_timed = bench.run_plain(healed.token_ids)
    assert bench.engine.decode(plain_timed[0].token_ids).startswith(removed)
    record = bench.run_prompt(healed, 0, plain_timed)
    assert all(run.matches_plain for run in record.runs.values())
    assert {"plain", "ngram", "auto"} <= set(record.runs)

    raw = Bench(default_model, None, max_new_tokens=8, peers=False)
    assert raw.healed(prompt) is prompt and raw.config.required_prefix == ""
