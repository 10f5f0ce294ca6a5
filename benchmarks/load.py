"""Load: N editors typing at once against one shared engine, against the same editors on the local one.

Each simulated editor is what a user runs: its own ``lsp_server`` process over stdio, typing a
stretch of a real source file back keystroke by keystroke (``replay.py``'s seeded, human-paced
script: a ``didChange`` and an automatic ``inlineCompletion`` per key, never cancelled by the
client, so the server's cancel-previous supersedes the stale ones). For N = 1, 2, 4, 8 editors
typing at the same time:

- ``remote``: every editor's server decodes on one ``llama-server`` with P parallel slots (``-np``,
  by default one per editor: a cancelled request's slot stays busy until its prompt batch ends, so
  with spare slots the next keystroke lands on a cold one and prefills from scratch) on the
  embedded GGUF, loopback only, one thread (the machine's cores are shared);
- ``local``: every editor's server decodes on its own local engine, on the same machine.

Reported per run: p50/p95 time from keystroke to answer at typing pauses (the requests a user
waits on; over all of them and over the non-empty ones), and, for the remote engine, its wasted
tokens: generated but never received by any editor, i.e. after the stream was closed by a cancel
(the engine's ``/metrics`` minus the tokens the editors' servers counted). Bounded in count
(``--lines`` per editor, ``--max-keys``) and in time (``--max-seconds`` per run).

    python -m benchmarks.load                      # N = 1,2,4,8, both engines, -np N
    python -m benchmarks.load --editors 1,2 --engines remote --parallel 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import random
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import llama_server
from benchmarks.decode_bench import write_json
from benchmarks.replay import (
    Keystroke,
    ReplayClient,
    RequestRecord,
    Segment,
    corpus_files,
    pct,
    pick_segment,
    replay_segment,
    typing_script,
)

log = logging.getLogger("benchmarks.load")
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "load.json"
ENGINES = ("remote", "local")
# What both engines share: the shipped defaults but for a budget that a loaded 2-core machine can
# keep (the figure is the latency, not whether it fits 2 s).
OPTIONS: dict[str, Any] = {"timeBudgetMs": 5000}


def gguf() -> Path:
    from speculative_complete.decoding.models.loading import default_gguf_path

    return default_gguf_path()


def scripts(
    count: int, lines: int, max_keys: int, cps: float, seed: int
) -> list[tuple[Segment, list[Keystroke]]]:
    """One segment of a different real source file per editor, and its keystrokes (at most
    ``max_keys``), all seeded."""
    rng = random.Random(seed)
    files = corpus_files([])
    rng.shuffle(files)
    out: list[tuple[Segment, list[Keystroke]]] = []
    for rel, path in files:
        segment = pick_segment(rel, path.read_text(encoding="utf-8", errors="replace"), rng, lines)
        if segment is None:
            continue
        keys = typing_script(segment.typed, cps, rng)[:max_keys]
        typed = "".join(k.text for k in keys)
        out.append((Segment(segment.file, segment.head, typed, segment.tail), keys))
        if len(out) == count:
            return out
    raise SystemExit(f"load: only {len(out)} usable files for {count} editors")


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    pairs = (line.split() for line in lines if line[:1] != "#")
    return {name.removeprefix("llamacpp:"): float(value) for name, value in pairs}


async def engine_idle(url: str, timeout_s: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while (m := metrics(url))["requests_processing"] > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return m


async def warm_up(editor: ReplayClient, segment: Segment, number: int) -> None:
    """The user had the file open before typing: one answered request at the cursor, so that
    both engines start from the document's prompt cache, as in an editing session (a cold
    512-token prefill on this CPU takes seconds, and every keystroke of a cold start is stale)."""
    uri = f"file:///replay/{number}/{Path(segment.file).name}"  # the uri replay_segment types into
    line = segment.head.count("\n")
    column = len(segment.head) - segment.head.rfind("\n") - 1
    await editor.open(uri, segment.head + segment.tail, (line, column))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(editor.request(uri, line, column), 30)


async def run_editors(
    engine: str,
    count: int,
    work: list[tuple[Segment, list[Keystroke]]],
    url: str | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """``count`` editors typing at once on ``engine``; the run's summary and its records."""
    options = dict(OPTIONS)
    if engine == "remote":
        options |= {"endpoint": url, "endpointApi": args.api}
    editors = [ReplayClient(f"{engine}-{count}-{i}", options, None) for i in range(count)]
    await asyncio.gather(*(e.start() for e in editors))
    pairs = list(enumerate(zip(editors, work, strict=True)))
    await asyncio.gather(*(warm_up(editor, segment, i) for i, (editor, (segment, _)) in pairs))
    before = await engine_idle(url) if url else {}
    warmed = [await e.stats() for e in editors]  # the warm-up's counts are not the run's
    started = time.monotonic()
    try:
        batches = await asyncio.wait_for(
            asyncio.gather(
                *(
                    replay_segment(editor, segment, keys, i, args.pause_ms)
                    for i, (editor, (segment, keys)) in pairs
                )
            ),
            args.max_seconds,
        )
        records = [r for batch in batches for r in batch]
        wall_s = time.monotonic() - started
        stats = [since(await e.stats(), w) for e, w in zip(editors, warmed, strict=True)]
    finally:
        await asyncio.gather(*(e.stop() for e in editors), return_exceptions=True)
    after = await engine_idle(url) if url else {}
    return summarize(engine, count, records, stats, before, after, wall_s)


def since(now: Any, then: Any) -> Any:
    """``now`` minus ``then`` for every count in a stats tree (latencies and text are kept)."""
    if isinstance(now, dict):
        return {k: since(v, then.get(k) if isinstance(then, dict) else None) for k, v in now.items()}
    if isinstance(now, int) and not isinstance(now, bool) and isinstance(then, int):
        return now - then
    return now


def summarize(
    engine: str,
    count: int,
    records: list[RequestRecord],
    stats: list[dict[str, Any]],
    before: dict[str, float],
    after: dict[str, float],
    wall_s: float,
) -> dict[str, Any]:
    pauses = [r for r in records if r.at_pause and r.latency_ms is not None]
    shown = [r for r in pauses if r.suggestion]
    out: dict[str, Any] = {
        "engine": engine,
        "editors": count,
        "requests": len(records),
        "unanswered": sum(r.latency_ms is None for r in records),
        "at_pauses": len(pauses),
        "p50_ms_at_pauses": pct([r.latency_ms for r in pauses], 50),
        "p95_ms_at_pauses": pct([r.latency_ms for r in pauses], 95),
        "p50_ms_nonempty_at_pauses": pct([r.latency_ms for r in shown], 50),
        "p95_ms_nonempty_at_pauses": pct([r.latency_ms for r in shown], 95),
        "suggestion_share_at_pauses": round(len(shown) / len(pauses), 3) if pauses else None,
        "superseded": sum(s["superseded"] for s in stats),
        "decodes": sum(s["decodes"] for s in stats),
        "decodes_cancelled": sum(s["stop_reasons"].get("cancelled", 0) for s in stats),
        "budget_exhausted": sum(s["budget_exhausted"] for s in stats),
        "wall_s": round(wall_s, 1),
    }
    blocks = [s["endpoint"] for s in stats if s.get("endpoint")]
    if blocks:
        received = sum(b["tokens"] for b in blocks)
        generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
        out |= {
            "engine_requests": sum(b["requests"] for b in blocks),
            "streams_cancelled": sum(b["cancelled"] + b["budget"] for b in blocks),
            "engine_errors": sum(b["errors"] for b in blocks),
            "engine_tokens": int(generated),
            "received_tokens": received,
            # generated after a stream was closed: the engine's count minus what reached an editor
            "wasted_tokens": max(0, int(generated) - received),
            "wasted_share": round(max(0, generated - received) / generated, 3) if generated else None,
            "from_chain": sum(b["prompts"]["from_chain"] for b in blocks),
        }
    return {"summary": out, "records": [r.__dict__ for r in records]}


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("engine", "engine"),
        ("N", "editors"),
        ("P", "slots"),
        ("requests", "requests"),
        ("p50 pause ms", "p50_ms_at_pauses"),
        ("p95 pause ms", "p95_ms_at_pauses"),
        ("p50 shown ms", "p50_ms_nonempty_at_pauses"),
        ("p95 shown ms", "p95_ms_nonempty_at_pauses"),
        ("shown", "suggestion_share_at_pauses"),
        ("cancelled", "decodes_cancelled"),
        ("engine tok", "engine_tokens"),
        ("wasted tok", "wasted_tokens"),
        ("wasted", "wasted_share"),
    ]
    cells = [[c for c, _ in cols]] + [
        ["-" if r.get(k) is None else str(r.get(k)) for _, k in cols] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def plot(path: Path, rows: list[dict[str, Any]]) -> Path | None:
    """p50 and p95 at pauses against the number of editors, one line per engine."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot")
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for engine, color in (("remote", "tab:blue"), ("local", "tab:orange")):
        mine = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["editors"])
        if not mine:
            continue
        n = [r["editors"] for r in mine]
        ax.plot(n, [r["p50_ms_at_pauses"] for r in mine], "o-", color=color, label=f"{engine} p50")
        ax.plot(n, [r["p95_ms_at_pauses"] for r in mine], "s--", color=color, label=f"{engine} p95")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_yscale("log")
    ax.set_xlabel("editors typing at once")
    ax.set_ylabel("keystroke to answer at typing pauses (ms)")
    ax.set_title("one llama-server (-np P) for all editors vs a local engine each", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.splitlines()[0])
    parser.add_argument("--editors", default="1,2,4,8", help="numbers of editors typing at once")
    parser.add_argument("--engines", default=",".join(ENGINES), help="remote, local, or both")
    parser.add_argument("--api", default="llama.cpp", choices=("llama.cpp", "openai"))
    parser.add_argument("--parallel", type=int, default=0, help="llama-server slots (-np); 0: one per editor")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads")
    parser.add_argument(
        "--batch",
        type=int,
        default=128,
        help="llama-server -b/-ub: a cancel takes effect between batches, so a smaller one stops "
        "a cancelled prefill sooner",
    )
    parser.add_argument("--lines", type=int, default=2, help="lines each editor types")
    parser.add_argument("--max-keys", type=int, default=60, help="keystrokes per editor, at most")
    parser.add_argument("--cps", type=float, default=6.0, help="typing speed, characters per second")
    parser.add_argument("--pause-ms", type=float, default=300.0, help="a pause is at least this long")
    parser.add_argument("--max-seconds", type=float, default=240.0, help="per run (one engine, one N)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(n) for n in args.editors.split(",")]
    engines = [e for e in args.engines.split(",") if e]
    work = scripts(max(counts), args.lines, args.max_keys, args.cps, args.seed)
    rows, records = [], {}
    for engine in engines:
        for count in counts:
            slots = args.parallel or count
            log.warning(
                "%s engine, %d editor(s) typing%s", engine, count, f", -np {slots}" * (engine == "remote")
            )
            server = None
            if engine == "remote":  # a fresh engine per run: no run starts on another's prompt caches
                server = llama_server.LlamaServer(
                    gguf(),
                    threads=args.threads,
                    parallel=slots,
                    context=1024 * slots,
                    extra_args=["--metrics"],
                ).start()
            try:
                result = await run_editors(engine, count, work[:count], server.url if server else None, args)
            finally:
                if server is not None:
                    server.stop()
            result["summary"]["slots"] = slots if engine == "remote" else None
            rows.append(result["summary"])
            records[f"{engine}-{count}"] = result["records"]
            log.warning("  %s", result["summary"])
    return {
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        },
        "settings": {**vars(args), "out": str(args.out), "options": OPTIONS},
        "rows": rows,
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    payload = asyncio.run(run(args))
    write_json(args.out, payload)
    table = format_table(payload["rows"])
    print(table)
    picture = plot(args.out, payload["rows"])
    print(f"results: {args.out}" + (f", plot: {picture}" if picture else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
