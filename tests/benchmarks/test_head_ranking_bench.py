"""The output layer's ranking benchmark on the default model, briefly: its candidates hold the
fp32 layer's greedy token, and the greedy-only layer picks that token, on held-out code."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_leading_terms_candidates_hold_the_fp32_greedy_token_on_held_out_code(tmp_path):
    out = tmp_path / "ranking.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.head_ranking", "--tokens", "512", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["positions"] == 512
    assert result["held_share"] == {"leading term": 1.0, "both terms": 1.0}
    assert result["greedy_only_is_fp32_share"] == 1.0
    assert result["repaired_per_position"] < 1.0  # the bound rarely sends a token to recomputation
    assert result["worst_rank"]["both terms"] <= result["worst_rank"]["leading term"] < result["candidates"]
    assert set(result["layer_ms_per_row"]) == {"greedy_only", "full"}
