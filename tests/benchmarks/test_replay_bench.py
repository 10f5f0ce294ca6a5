"""A smoke run of the keystroke replay benchmark: a tiny model, a two-file corpus, fast typing.

It checks the benchmark's mechanics (every request answered and recorded, every configuration
replayed on the same keystrokes, JSON and plot written), not any number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.replay import RequestRecord, shown_by_all, summarize
from tests.support import lsp as h


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
            "--server-logs",
            str(tmp_path / "logs"),
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
    # without a drafter, every pass after the prefill yields exactly one token
    assert payload["summary"]["baseline"]["tokens_per_pass_after_prefill"] == 1.0
    assert payload["summary"]["shipped"]["tokens_per_pass_after_prefill"] >= 1.0
    assert "after prefill" in done.stdout
    for config in ("shipped", "baseline"):  # every request job that ran, superseded ones too
        queued = payload["summary"][config]["queued_ms"]
        assert 0 < queued["count"] <= keystrokes and 0 <= queued["p50"] <= queued["p95"] <= queued["max"]
    assert "queued before the worker took it" in done.stdout
    for config in ("shipped", "baseline"):  # each server's own resident memory, from its stats
        memory = payload["summary"][config]["memory"]
        assert 100 < memory["ready_rss_mb"] <= memory["peak_rss_mb"]
        assert 100 < memory["end_rss_mb"] <= memory["peak_rss_mb"]
    for config in ("shipped", "baseline"):  # each server's debug log: one line per answer
        log = (tmp_path / "logs" / f"{config}.log").read_text()
        assert log.count(" ms: ") >= keystrokes // 2


def record(config: str, key: int, latency_ms: float, suggestion: str | None, at_pause: bool = True):
    return RequestRecord(config, "a.py", key, 0.0, latency_ms, False, at_pause, suggestion, "x", False, 0)


def test_the_like_for_like_median_takes_only_keystrokes_where_every_configuration_showed_one():
    records = [
        record("ours", 0, 5.0, "a"),  # both show: counted
        record("peer", 0, 30.0, "a"),
        record("ours", 1, 400.0, "a block"),  # only ours shows: left out of the like-for-like set
        record("peer", 1, 9.0, None),
        record("ours", 2, 7.0, "b", at_pause=False),  # not at a pause
        record("peer", 2, 40.0, "b", at_pause=False),
        record("ours", 3, 9.0, "c"),
        record("peer", 3, 50.0, "c"),
    ]
    assert shown_by_all(records) == {("a.py", 0), ("a.py", 3)}
    summary = summarize(records, {}, typed_chars=10, baseline="peer")
    assert summary["ours"]["shown_by_all_at_pauses"] == 2
    assert summary["ours"]["p50_ms_shown_by_all_at_pauses"] == 5.0
    assert summary["peer"]["p50_ms_shown_by_all_at_pauses"] == 30.0
    assert summary["ours"]["p50_ms_nonempty_at_pauses"] == 9.0  # its own three shown answers
