"""The real draft/target pair on code continuation: ours (plain greedy, n-gram drafts, the draft
model's, and ``auto`` as the server ships it) against llama-server plain and with its own draft
model (``-md``), on the same GGUF files and the same prompts, in one invocation.

Why its own benchmark: ``decode_bench`` drafts from the target's own bf16 copy and compares
drafters on one model; the promise of draft-small/verify-large is two files (the real
Qwen2.5-Coder-0.5B drafting for the 1.5B, one vocabulary), and its yardstick is llama.cpp's own
speculative decoding on the same pair. Prompts are ``decode_bench``'s cold slice (held-out stdlib
files, the tokens before a cursor); every method decodes ``--max-new-tokens`` greedily and ours
must return plain greedy's tokens exactly (a mismatch is recorded and fails the run). A figure is
milliseconds a token after the prompt's pass, both sides by the same rule (llama-server's
``predicted_per_token_ms``: decode time over tokens generated), each prompt's fastest of
``--repeats`` rounds, summed over prompts. Within a round every method runs in turn (the peers'
servers stay up), in an order reversed round by round: on a shared machine a slow minute then
falls on all of them, where method after method put it on one. The draft model's own pass over
the prompt falls in that time on both sides; ours keeps the draft's cache between rounds, as the
server keeps it within a document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.decode_bench import PromptSource, stdlib_files
from benchmarks.humaneval import machine
from benchmarks.llama_server import LlamaServer
from benchmarks.models_bench import post_json
from benchmarks.real_models import RealModelError, resolve
from speculative_complete.decoding.drafters import Drafter, load_head_drafter, make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.models.loading import check_draft_compatible, load_model

log = logging.getLogger("benchmarks.pair_bench")

OURS = ("plain", "ngram", "model", "auto")
PEERS = ("llama_plain", "llama_md")


@dataclass
class Run:
    """One method on one prompt: its fastest round."""

    method: str
    tokens: int
    decode_ms: float
    token_ids: list[int]
    tokens_per_pass: float | None = None
    drafted: int | None = None  # llama-server -md: its draft tokens, and how many it kept
    accepted: int | None = None


@dataclass
class PromptRuns:
    file: str
    line: int
    prompt_tokens: int
    runs: dict[str, Run] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pair_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--target", default="qwen2.5-coder-1.5b", help="a GGUF file or a real model's name")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="a GGUF file or a real model's name")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=2, help="rounds per prompt and method, the fastest kept"
    )
    parser.add_argument("--methods", default=",".join(OURS + PEERS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


class Ours:
    """The target and draft loaded once, one drafter per method (each keeps its own statistics,
    as the server's one drafter does across requests)."""

    def __init__(self, target: Path, draft: Path, methods: list[str]) -> None:
        self.target, self.draft = load_model(str(target)), load_model(str(draft), draft=True)
        check_draft_compatible(self.target, self.draft)
        self.engine = SpeculativeEngine(self.target)
        head = load_head_drafter(self.target, "auto", cost=self.engine.cost)
        self.drafters: dict[str, Drafter | None] = {}
        for method in methods:
            name = "none" if method == "plain" else method
            self.drafters[method] = make_drafter(
                name,
                draft_model=self.draft,
                draft_head=head,
                cost=self.engine.cost,
                target_vocab=self.target.vocab_size,
            )

    def run(self, method: str, ids: list[int], max_new_tokens: int) -> Run:
        config = GenerationConfig(max_new_tokens=max_new_tokens, reuse_continuation=False)
        result = self.engine.generate(ids, config, self.drafters[method])
        stats = result.stats
        return Run(
            method, stats.new_tokens, stats.decode_ms, list(result.token_ids), round(stats.tokens_per_pass, 3)
        )


def peer_run(server: LlamaServer, method: str, ids: list[int], max_new_tokens: int) -> Run:
    """llama-server's greedy continuation of the same token ids, its cache off (a cold prompt, as
    ours), its own timings."""
    body = {
        "prompt": ids,
        "n_predict": max_new_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
        "return_tokens": True,
    }
    answer = post_json(f"{server.url}/completion", body)
    timings = answer["timings"]
    tokens = int(timings["predicted_n"])
    return Run(
        method,
        tokens,
        float(timings["predicted_ms"]),
        [int(t) for t in answer.get("tokens", [])],
        drafted=timings.get("draft_n"),
        accepted=timings.get("draft_n_accepted"),
    )


def model_path(spec: str) -> Path:
    """A GGUF file, or an installed real model by name (``benchmarks/real_models.py``)."""
    try:
        return resolve(spec)
    except RealModelError as exc:
        raise SystemExit(f"pair_bench: {exc}") from exc


# llama.cpp's speculation with a draft model: since the speculative types (b11434's ``--spec-type``),
# ``-md`` alone loads the draft and never drafts (the type is inferred only for MTP and sidecar
# drafts), so the peer would decode plain.
DRAFT_MODEL_ARGS = ("--spec-type", "draft-simple")


def peer_server(method: str, target: Path, draft: Path) -> LlamaServer:
    """llama-server on the target, with the draft model (``-md``) drafting for ``llama_md``."""
    extra = ["-md", str(draft), *DRAFT_MODEL_ARGS] if method == "llama_md" else []
    return LlamaServer(target, extra_args=extra)


def run_method(ours: Ours, servers: dict[str, LlamaServer], method: str, ids: list[int], tokens: int) -> Run:
    if method in servers:
        return peer_run(servers[method], method, ids, tokens)
    return ours.run(method, ids, tokens)


def fastest(runs: list[Run]) -> Run:
    return min(runs, key=lambda run: run.decode_ms)


def pick_prompts(engine: SpeculativeEngine, count: int, prompt_tokens: int, seed: int) -> list[Any]:
    source = iter(PromptSource(engine, stdlib_files(), "cold", prompt_tokens, seed))
    return [next(source) for _ in range(count)]


def summarize(records: list[PromptRuns], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method: ms a token over all prompts (decode time summed over tokens summed), and
    whether every prompt's tokens were plain greedy's."""
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        runs = [r.runs[method] for r in records if method in r.runs]
        tokens = sum(run.tokens for run in runs)
        plain = [r.runs["plain"].token_ids for r in records if method in r.runs and "plain" in r.runs]
        out[method] = {
            "ms_per_token": round(sum(run.decode_ms for run in runs) / max(tokens, 1), 2),
            "tokens": tokens,
            "same_tokens_as_plain": [run.token_ids for run in runs] == plain if plain else None,
        }
        if method == "llama_md":
            drafted = sum(run.drafted or 0 for run in runs)
            out[method]["drafted"] = drafted
            out[method]["acceptance"] = round(sum(run.accepted or 0 for run in runs) / max(drafted, 1), 3)
        elif method in OURS:
            out[method]["tokens_per_pass"] = [run.tokens_per_pass for run in runs]
    return out


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    base = summary.get("plain", {}).get("ms_per_token")
    lines = [f"{'method':<14} {'ms/token':>9} {'x our plain':>12} {'same tokens':>12}"]
    for method, row in summary.items():
        ratio = f"{base / row['ms_per_token']:.2f}x" if base and row["ms_per_token"] else "-"
        lines.append(
            f"{method:<14} {row['ms_per_token']:>9.2f} {ratio:>12} {row['same_tokens_as_plain']!s:>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(OURS + PEERS)
    if unknown or "plain" not in methods:
        raise SystemExit(
            f"--methods: plain and any of {', '.join(OURS + PEERS)} (unknown: {sorted(unknown)})"
        )
    target, draft = model_path(args.target), model_path(args.draft)
    ours = Ours(target, draft, [m for m in methods if m in OURS])
    prompts = pick_prompts(ours.engine, args.prompts, args.prompt_tokens, args.seed)
    records = [PromptRuns(p.file, p.line, len(p.token_ids)) for p in prompts]
    with contextlib.ExitStack() as stack:
        servers = {
            method: stack.enter_context(peer_server(method, target, draft))
            for method in methods
            if method in PEERS
        }
        for method in ["plain", *servers]:  # warm-up: first-call allocations
            run_method(ours, servers, method, prompts[0].token_ids[-64:], 8)
        for prompt, record in zip(prompts, records, strict=True):
            rounds: dict[str, list[Run]] = {method: [] for method in methods}
            for number in range(args.repeats):
                order = methods if number % 2 == 0 else methods[::-1]
                for method in order:
                    run = run_method(ours, servers, method, prompt.token_ids, args.max_new_tokens)
                    rounds[method].append(run)
            for method, runs in rounds.items():
                record.runs[method] = fastest(runs)
                log.info("%s %s:%d %.1f", method, prompt.file, prompt.line, record.runs[method].decode_ms)
    summary = summarize(records, methods)
    print(machine()["cpu"], file=sys.stderr)
    print(format_table(summary))
    report = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "target": str(target),
        "draft": str(draft),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "summary": summary,
        "prompts": [asdict(r) for r in records],
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    exact = all(row["same_tokens_as_plain"] is not False for m, row in summary.items() if m in OURS)
    if summary.get("llama_md", {}).get("drafted") == 0:
        log.error("llama-server -md drafted nothing: it decoded plain, so it is not the peer it names")
        return 1
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
