"""Soak: the real server process under a long, seeded, hostile mix of traffic, with faults on top.

One ``lsp_server --stdio`` process gets real source files (the Python standard library, plus C,
JavaScript, TypeScript and Go files where the machine has them) opened, typed into (non-ASCII and
astral characters, UTF-16 positions), closed and reopened, a 6 MB document, inline and fallback
completion requests after most edits, ``$/cancelRequest`` at random moments, and bad traffic:
positions out of range, missing and null params, wrong types, unknown methods, truncated frames,
frames that are not JSON or not UTF-8, wrong Content-Lengths. Faults on top: the model reloaded
from a path that does not exist and back while typing, an exception raised inside one decode
(the server started through ``benchmarks/soak_server.py``), then, on fresh processes, stdin
closed without ``exit`` in the middle of a decode, and a TCP client dropping mid-request.

What it checks (``problems`` in the report; none means it held): every request the server could
parse got exactly one answer of the right kind; the server answers at the end; its RSS after
warm-up stays under a bound that does not depend on how many requests were sent; the counters of
``lsp_server/stats`` match what was sent; ``shutdown`` + ``exit`` ends it with 0; the fault
processes end within 2 s, leaving no process behind.

    python -m benchmarks.soak                          # the default model, 3000 steps
    python -m benchmarks.soak --model PATH --steps 800 # any model (the tests use a tiny one)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import soak_faults
from benchmarks.soak_server import FAULT_NOTE
from benchmarks.soak_traffic import LANGUAGES, Doc, Typist, bad_frames, bad_requests, corpus, inline_params
from benchmarks.soak_wire import ABSENT, Wire, inet_sockets, rss_mb

log = logging.getLogger("benchmarks.soak")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "soak.json"
STATS = "lsp_server/stats"
INLINE, COMPLETION = "textDocument/inlineCompletion", "textDocument/completion"
CANCELLED, INVALID_PARAMS, NOT_FOUND = -32800, -32602, -32601
ANSWER_GUARD_S = 120.0  # hang guard per answer, generous on a loaded machine
BIG_URI = "file:///soak/huge.py"


@dataclass
class SoakConfig:
    model: str | None = None  # None: the server's default model
    steps: int = 3000
    seed: int = 0
    files: int = 64
    big_mb: float = 6.0
    faults: bool = True
    fault_decode: int = 25  # the request job that fails mid-decode (``soak_server.py``)
    max_in_flight: int = 3
    # The bound: RSS after warm-up plus the KV caches' budget (kvCacheMb, 256 MB by default: the
    # per-document caches may still be filling then) plus 200 MB of transient buffers (copies of a
    # 6 MB document, a model reload).
    rss_margin_mb: float = 256.0 + 200.0
    rss_growth_mb: float = 100.0  # the run's second half may not peak higher than its first by more
    options: dict[str, Any] = field(default_factory=lambda: {"debounceMs": 10, "timeBudgetMs": 3000})
    log_dir: Path | None = None


@dataclass
class Tally:
    """What was sent, and what each request should get."""

    files: int = 0  # documents from real source files (the big one apart)
    steps: int = 0
    edits: int = 0
    opens: int = 0
    closes: int = 0
    completion_requests: int = 0  # reach the completion handler: the server's `requests`
    fallback_requests: int = 0
    cancels: int = 0
    bad_requests: int = 0
    bad_frames: int = 0
    bad_notifications: int = 0
    expect: dict[int, str] = field(
        default_factory=dict
    )  # id -> "result" | "result_or_cancel" | "invalid" ...
    rss: list[tuple[int, float]] = field(default_factory=list)  # (requests sent so far, MB)
    frames: dict[str, int] = field(default_factory=dict)
    inet_sockets: int = 0  # the most TCP/UDP sockets the server held at a sample: none, over stdio


class Soak:
    """One soak run against one server process."""

    def __init__(self, config: SoakConfig, wire: Wire, docs: list[Doc], big: Doc | None) -> None:
        self.config, self.wire, self.docs, self.big = config, wire, docs, big
        self.rng = random.Random(config.seed)
        self.typist = Typist(random.Random(config.seed + 1))
        self.tally = Tally()
        self.current = docs[0]
        self.tasks: set[asyncio.Task] = set()

    # -- documents -------------------------------------------------------------------------------
    async def open(self, doc: Doc) -> None:
        doc.version, doc.open = 1, True
        await self.wire.notify("textDocument/didOpen", {"textDocument": doc.item()})
        self.tally.opens += 1

    async def close(self, doc: Doc) -> None:
        doc.open = False
        await self.wire.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
        self.tally.closes += 1

    async def edit(self, doc: Doc) -> None:
        change = self.typist.edit(doc)
        await self.wire.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": doc.uri, "version": doc.version}, "contentChanges": [change]},
        )
        self.tally.edits += 1

    # -- requests ----------------------------------------------------------------------------------
    async def throttle(self) -> None:
        """At most ``max_in_flight`` unanswered requests: wait for the oldest."""
        waiting = [i for i in self.tally.expect if i not in self.wire.answers]
        for msg_id in waiting[: max(0, len(waiting) - self.config.max_in_flight + 1)]:
            await self.wire.answer(msg_id, ANSWER_GUARD_S)

    async def complete(self, doc: Doc) -> None:
        await self.throttle()
        fallback = self.rng.random() < 0.15
        params = inline_params(doc, self.rng.choice([1, 2]))
        if fallback:
            params = {**params, "context": {"triggerKind": 1}}
        msg_id = await self.wire.request(COMPLETION if fallback else INLINE, params)
        self.tally.completion_requests += 1
        self.tally.fallback_requests += int(fallback)
        self.tally.expect[msg_id] = "result_or_cancel"
        if self.rng.random() < 0.2:
            delay = self.rng.choice([0.0, self.rng.uniform(0.0, 0.08)])
            task = asyncio.ensure_future(self.cancel(msg_id, delay))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def cancel(self, msg_id: int, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        await self.wire.notify("$/cancelRequest", {"id": msg_id})
        self.tally.cancels += 1

    async def bad_request(self, doc: Doc) -> None:
        await self.throttle()
        for _label, message, outcome in bad_requests(doc, self.wire.new_id(), self.rng):
            self.wire.sent[message["id"]] = message["method"]
            await self.wire.send(message)
            self.tally.expect[message["id"]] = outcome
            self.tally.bad_requests += 1
            self.tally.completion_requests += int(outcome in ("error", "answer"))

    async def bad_frame(self, doc: Doc) -> None:
        msg_id = self.wire.new_id()
        label, data, answered = bad_frames(self.rng, doc, msg_id)
        await self.wire.write(data)
        self.tally.bad_frames += 1
        self.tally.frames[label] = self.tally.frames.get(label, 0) + 1
        if answered:
            self.wire.sent[msg_id] = INLINE
            self.tally.expect[msg_id] = "answer"
            self.tally.completion_requests += 1

    async def bad_notification(self) -> None:
        """Notifications that are wrong: nothing to answer, nothing may break."""
        choice = self.rng.randrange(5)
        if choice == 0:
            await self.wire.notify("$/cancelRequest", self.rng.choice([None, ABSENT, {"id": "nope"}, {}]))
        elif choice == 1:
            await self.wire.notify(
                "textDocument/didChange",
                {
                    "textDocument": {"uri": "file:///never/opened.py", "version": 3},
                    "contentChanges": [{"text": "x"}],
                },
            )
        elif choice == 2:
            await self.wire.notify("soak/unknownNotification", {"x": 1})
        elif choice == 3:
            await self.wire.notify(
                "textDocument/didClose", {"textDocument": {"uri": "file:///never/opened.py"}}
            )
        else:
            await self.wire.notify("textDocument/didOpen", None)
        self.tally.bad_notifications += 1

    # -- the mix -----------------------------------------------------------------------------------
    async def step(self, index: int) -> None:
        self.tally.steps += 1
        roll = self.rng.random()
        open_docs = [d for d in self.docs if d.open]
        if not self.current.open or self.rng.random() < 0.04:
            self.current = self.rng.choice(open_docs)
        if roll < 0.72:
            await self.edit(self.current)
            if self.rng.random() < 0.85:
                await self.complete(self.current)
        elif roll < 0.77:
            closed = [d for d in self.docs if not d.open]
            if closed and (len(open_docs) < 4 or self.rng.random() < 0.5):
                await self.open(self.rng.choice(closed))
            elif len(open_docs) > 1:
                await self.close(self.rng.choice([d for d in open_docs if d is not self.big] or open_docs))
        elif roll < 0.86:
            await self.bad_request(self.current)
        elif roll < 0.91:
            await self.bad_frame(self.current)
        elif roll < 0.96:
            await self.bad_notification()
        else:
            await self.throttle()
            self.tally.expect[await self.wire.request(STATS, self.rng.choice([ABSENT, None, {}]))] = "result"
        if index % 25 == 0:
            sample = rss_mb(self.wire.process.pid)
            if sample is not None:
                self.tally.rss.append((self.tally.completion_requests, round(sample, 1)))
            self.tally.inet_sockets = max(self.tally.inet_sockets, inet_sockets(self.wire.process.pid))
        if self.rng.random() < 0.3:
            await asyncio.sleep(self.rng.uniform(0.0, 0.02))  # a human pause now and then


# -- the run ----------------------------------------------------------------------------------------
def server_command(model: str | None, fail_decode: int = 0) -> list[str]:
    """The server over stdio; with ``fail_decode``, the one whose N-th decode fails (``soak_server.py``)."""
    entry = (
        ["benchmarks.soak_server", "--fail-decode", str(fail_decode)]
        if fail_decode
        else ["speculative_complete.lsp_server"]
    )
    command = [sys.executable, "-m", *entry, "--stdio", "--log-level", "WARNING"]
    return command + ["--model", model] if model else command


def documents(config: SoakConfig) -> tuple[list[Doc], Doc | None]:
    """The corpus as documents, and the big one (real files concatenated up to ``big_mb``)."""
    docs = []
    for i, path in enumerate(corpus(config.files, config.seed)):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append(Doc.from_text(f"file:///soak/{i:03d}/{path.name}", LANGUAGES[path.suffix], text))
    if config.big_mb <= 0:
        return docs, None
    parts, size = [], 0
    while size < config.big_mb * 1e6:
        for doc in docs:
            if doc.language_id == "python":
                parts.append(doc.text)
                size += len(parts[-1])
    return docs, Doc.from_text(BIG_URI, "python", "\n".join(parts))


async def drive(soak: Soak) -> None:
    """The steps, with the reload fault and the big document at fixed points of the run."""
    config, wire = soak.config, soak.wire
    steps = config.steps
    for doc in soak.docs[:6]:
        await soak.open(doc)
    for i in range(steps):
        if soak.big is not None and i == steps // 10:
            await soak.open(soak.big)
            soak.docs.append(soak.big)
            soak.current = soak.big
        if config.faults and i == int(steps * 0.4):  # reload to a path that does not exist...
            await wire.notify(
                "workspace/didChangeConfiguration",
                {"settings": {"lspServer": {"model": "/nonexistent/soak-model"}}},
            )
        if config.faults and i == int(steps * 0.45):  # ... and back, while typing goes on
            await wire.notify("workspace/didChangeConfiguration", {"settings": {"lspServer": {}}})
        await soak.step(i)
    await asyncio.gather(*soak.tasks)
    for msg_id in list(soak.tally.expect):
        await wire.answer(msg_id, ANSWER_GUARD_S)


def check_answers(wire: Wire, tally: Tally) -> list[str]:
    """Every request the server could parse answered once, with the kind of answer it deserves."""
    problems = []
    good = {
        "result": lambda a, code: "result" in a,
        "result_or_cancel": lambda a, code: "result" in a or code == CANCELLED,
        "answer": lambda a, code: "result" in a or code == CANCELLED,
        "error": lambda a, code: code == INVALID_PARAMS,
        "invalid": lambda a, code: code == INVALID_PARAMS,
        "not_found": lambda a, code: code == NOT_FOUND,
    }
    for msg_id, expected in tally.expect.items():
        answers = wire.answers.get(msg_id, [])
        if len(answers) != 1:
            problems.append(f"request {msg_id} ({wire.sent.get(msg_id)}) got {len(answers)} answers")
            continue
        code = (answers[0].get("error") or {}).get("code")
        if not good[expected](answers[0], code):
            problems.append(
                f"request {msg_id} ({wire.sent.get(msg_id)}): expected {expected}, got {answers[0]}"
            )
    unknown = [i for i in wire.answers if i not in wire.sent]
    if unknown:
        problems.append(f"answers to ids never sent: {unknown[:10]}")
    return problems


def check_stats(
    stats: dict[str, Any], wire: Wire, tally: Tally, faults: bool, server_log: str = ""
) -> list[str]:
    """The server's counters against what was sent and answered."""
    counted = [
        i
        for i, e in tally.expect.items()  # what reaches the completion handler
        if wire.sent.get(i) in (INLINE, COMPLETION) and e not in ("invalid", "not_found")
    ]
    codes = [(wire.answers[i][0].get("error") or {}).get("code") for i in counted if i in wire.answers]
    expected = {
        "requests": tally.completion_requests,
        "answered": tally.completion_requests,
        "cancelled": codes.count(CANCELLED),
        "errors": codes.count(INVALID_PARAMS),
    }
    problems = [
        f"stats {name} = {stats[name]}, expected {value}"
        for name, value in expected.items()
        if stats[name] != value
    ]
    if len(counted) != tally.completion_requests:
        problems.append(f"{len(counted)} counted requests tracked, {tally.completion_requests} sent")
    # A request whose decode raised is counted as failed, unless a newer request had superseded it
    # (or a cancel arrived) first: it was answered then, and only the server's log shows the fault.
    if faults and stats["failed"] < 1 and FAULT_NOTE not in server_log:
        problems.append("the injected decode fault did not show as a failed request or in the log")
    return problems


def check_rss(tally: Tally, margin_mb: float, growth_mb: float) -> tuple[list[str], dict[str, Any]]:
    """RSS after warm-up (a fifth of the run, the big document open) plus a fixed margin bounds
    every later sample, and the second half of the run peaks no higher than the first (within
    ``growth_mb``): memory does not grow with the number of requests."""
    samples = tally.rss
    if len(samples) < 5:
        return ["too few RSS samples"], {}
    warm_index = len(samples) // 5
    warm = max(mb for _, mb in samples[: warm_index + 1])
    later = [mb for _, mb in samples[warm_index:]]
    half = len(later) // 2
    figures = {
        "warm_mb": warm,
        "bound_mb": warm + margin_mb,
        "peak_mb": max(mb for _, mb in samples),
        "first_half_peak_mb": max(later[: half + 1]),
        "second_half_peak_mb": max(later[half:]),
        "samples": len(samples),
    }
    problems = []
    if max(later) > warm + margin_mb:
        problems.append(f"RSS {max(later)} MB over the bound {warm + margin_mb} MB")
    if figures["second_half_peak_mb"] > figures["first_half_peak_mb"] + growth_mb:
        problems.append(
            f"RSS grew: second half's peak {figures['second_half_peak_mb']} MB, first half's "
            f"{figures['first_half_peak_mb']} MB"
        )
    return problems, figures


async def finish(wire: Wire, tally: Tally, faults: bool) -> tuple[list[str], dict[str, Any], int | None]:
    """After the mix: the model ready again, one good request answered, shutdown + exit -> 0."""
    problems = []
    if faults and not any(
        n.get("method") == "window/showMessage" and "could not load model" in n["params"]["message"]
        for n in wire.notifications
    ):
        problems.append("the reload to a bad path was not reported with window/showMessage")
    await wire.wait_ready()
    uri = "file:///soak/final.py"
    await wire.notify(
        "textDocument/didOpen",
        {
            "textDocument": {
                "uri": uri,
                "languageId": "python",
                "version": 1,
                "text": "def add(a, b):\n    return ",
            }
        },
    )
    final_id = await wire.request(
        INLINE,
        {
            "textDocument": {"uri": uri},
            "position": {"line": 1, "character": 11},
            "context": {"triggerKind": 1},
        },
    )
    tally.expect[final_id] = "result"
    tally.completion_requests += 1
    final = await wire.answer(final_id, ANSWER_GUARD_S)
    if "result" not in final:
        problems.append(f"the last request was not answered with a result: {final}")
    stats = (await wire.call(STATS, ABSENT))["result"]
    shutdown = await wire.call("shutdown", ABSENT)
    if shutdown.get("result", "missing") is not None:
        problems.append(f"shutdown answered {shutdown}")
    await wire.notify("exit")
    try:
        code = await asyncio.wait_for(wire.process.wait(), 30.0)
    except TimeoutError:
        code = None
        wire.process.kill()
    return problems, stats, code


async def soak(config: SoakConfig) -> dict[str, Any]:
    """One whole soak: the mix on one process, then the process faults; the report."""
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="soak-"))
    command = server_command(config.model)
    docs, big = documents(config)
    started = time.monotonic()
    mixed = server_command(config.model, config.fault_decode if config.faults else 0)
    wire = await Wire.start(mixed, log_dir / "server.log")
    run = Soak(config, wire, docs, big)
    run.tally.files = len(docs)
    stats: dict[str, Any] = {}
    code: int | None = None
    try:
        await wire.initialize(config.options)
        await wire.wait_ready()
        await drive(run)
        problems, stats, code = await finish(wire, run.tally, config.faults)
    except TimeoutError:  # the server stopped answering: say so, with what was seen until then
        problems = [f"no answer within {ANSWER_GUARD_S} s after {run.tally.steps} steps"]
    finally:
        mix_s = time.monotonic() - started
        if wire.process.returncode is None:
            wire.process.kill()
            await wire.process.wait()
    if not stats:
        return report(
            config,
            run.tally,
            wire,
            stats,
            {},
            {},
            problems + check_answers(wire, run.tally),
            mix_s,
            mix_s,
            log_dir,
        )
    problems += check_answers(wire, run.tally) + check_stats(
        stats, wire, run.tally, config.faults, (log_dir / "server.log").read_text(errors="replace")
    )
    if run.tally.inet_sockets:
        problems.append(f"the server held {run.tally.inet_sockets} network sockets under --stdio")
    if wire.protocol_errors:
        problems.append(f"not LSP on stdout: {wire.protocol_errors[:3]}")
    if code != 0:
        problems.append(f"shutdown + exit ended the process with {code}")
    rss_problems, rss = check_rss(run.tally, config.rss_margin_mb, config.rss_growth_mb)
    problems += rss_problems
    faults: dict[str, Any] = {}
    if config.faults:
        faults["stdin_closed"] = await soak_faults.stdin_closed(command, log_dir / "stdin_closed.log")
        faults["tcp_dropped"] = await soak_faults.tcp_dropped(command, log_dir / "tcp_dropped.log")
        for name, outcome in faults.items():
            if outcome["exit_code"] is None or outcome["seconds"] > 2.0 or outcome["survivors"]:
                problems.append(f"{name}: {outcome}")
    return report(
        config, run.tally, wire, stats, rss, faults, problems, mix_s, time.monotonic() - started, log_dir
    )


def shown_messages(wire: Wire) -> dict[str, int]:
    """``window/showMessage`` texts (the start of each) and how often: what a user would have seen."""
    counts: dict[str, int] = {}
    for note in wire.notifications:
        if note.get("method") == "window/showMessage":
            text = str(note["params"]["message"])[:70]
            counts[text] = counts.get(text, 0) + 1
    return counts


def report(
    config: SoakConfig,
    tally: Tally,
    wire: Wire,
    stats: dict[str, Any],
    rss: dict[str, Any],
    faults: dict[str, Any],
    problems: list[str],
    mix_s: float,
    total_s: float,
    log_dir: Path,
) -> dict[str, Any]:
    answered = sum(1 for i in tally.expect if len(wire.answers.get(i, [])) == 1)
    settings = asdict(config)
    settings["log_dir"] = str(log_dir)
    return {
        "config": settings,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "figures": {
            "files": tally.files,
            "network_sockets": tally.inet_sockets,
            "steps": tally.steps,
            "requests": len(tally.expect),
            "completion_requests": tally.completion_requests,
            "fallback_requests": tally.fallback_requests,
            "edits": tally.edits,
            "opens": tally.opens,
            "closes": tally.closes,
            "cancels": tally.cancels,
            "bad_requests": tally.bad_requests,
            "bad_frames": tally.bad_frames,
            "bad_notifications": tally.bad_notifications,
            "answered": answered,
            "peak_rss_mb": rss.get("peak_mb"),
            "mix_s": round(mix_s, 1),
            "duration_s": round(total_s, 1),
        },
        "bad_frames": tally.frames,
        "shown_to_user": shown_messages(wire),
        "rss": rss,
        "rss_samples": tally.rss,
        "faults": faults,
        "server_stats": {
            k: stats.get(k)
            for k in (
                "requests",
                "answered",
                "cancelled",
                "superseded",
                "failed",
                "empty",
                "errors",
                "decodes",
                "latency_ms",
            )
        },
        "problems": problems,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the server's --model (default: its embedded default model)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--big-mb", type=float, default=6.0)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    config = SoakConfig(
        model=args.model,
        steps=args.steps,
        seed=args.seed,
        files=args.files,
        big_mb=args.big_mb,
        faults=not args.no_faults,
    )
    result = asyncio.run(soak(config))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        json.dumps(
            {
                "figures": result["figures"],
                "rss": result["rss"],
                "faults": result["faults"],
                "problems": result["problems"],
            },
            indent=1,
        )
    )
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
