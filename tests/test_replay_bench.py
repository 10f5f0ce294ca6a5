"""A smoke run of the keystroke replay benchmark: a tiny model, a two-file corpus, fast typing.

It checks the benchmark's mechanics (every request answered and recorded, every configuration
replayed on the same keystrokes, JSON and plot written), not any number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import lsp_helpers as h


def write_corpus(folder: Path) -> None:
    folder.mkdir()
    for name, word in (("shapes.py", "area"), ("money.py", "amount"), ("helpers.py", "amount")):
        body = "".join(
            f"def {word}_{i}(value):\n    result = value * {i}\n    return result + {i}\n\n"
            for i in range(20)
        )
        (folder / name).write_text(body)


def test_the_replay_records_every_request_for_every_configuration(tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    out = tmp_path / "replay.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.replay",
            "--corpus",
            str(corpus),
            "--files",
            "2",
            "--lines",
            "2",
            "--cps",
            "30",
            "--configs",
            "shipped,baseline",
            "--model",
            str(h.tiny_model_dir()),
            "--options",
            json.dumps({"maxNewTokens": 6, "timeBudgetMs": 0}),
            "--out",
            str(out),
            "--workspace",  # the file not typed: our servers' workspace
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(out.read_text())
    records = payload["records"]
    assert {r["config"] for r in records} == {"shipped", "baseline"}
    assert len({r["file"] for r in records}) == 2
    keystrokes = sum(s["keystrokes"] for s in payload["segments"])
    for config in ("shipped", "baseline"):
        mine = [r for r in records if r["config"] == config]
        assert len(mine) == keystrokes  # one request per keystroke, the same keystrokes for both
        assert all(r["latency_ms"] is not None for r in mine)  # every request was answered
        assert payload["summary"][config]["unanswered"] == 0
        assert payload["server_stats"][config]["answered"] == payload["server_stats"][config]["requests"]
    assert payload["summary"]["baseline"]["p50_ms_at_pauses_x_faster_than_baseline"] == 1.0
    assert payload["server_stats"]["baseline"]["kv_cache"]["reused_tokens"] == 0
    assert payload["server_stats"]["shipped"]["kv_cache"]["reused_tokens"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000
    workspace = payload["summary"]["shipped"]["workspace_index"]
    assert workspace["files"] == 1 and workspace["tokens"] > 0
    assert "p50 pause ms" in done.stdout and "shipped" in done.stdout
    for config in ("shipped", "baseline"):  # each server's own resident memory, from its stats
        memory = payload["summary"][config]["memory"]
        assert 100 < memory["ready_rss_mb"] <= memory["peak_rss_mb"]
        assert 100 < memory["end_rss_mb"] <= memory["peak_rss_mb"]
