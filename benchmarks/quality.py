"""Completion-quality benchmark: the naive prompt against the syntax-aware context, same run.

Why this shape:

* Real code nobody here wrote, nothing fetched at run time: the Python standard library (found
  through ``sysconfig``), npm's own JavaScript under the Node install, and the C headers in
  ``/usr/include``. Files, lines and cursor columns come from a seeded RNG.
* The case the server serves: the user is writing a line. The document is the whole file with
  the rest of the cursor's line removed (the lines below stay); the cursor sits after the line's
  indentation or at a random column inside it. A completion is scored against the line's real
  rest by exact match (whitespace at the end aside) and by edit similarity
  (1 - Levenshtein distance / the longer length).
* Two prompts, the same token budget, the same model, greedy, one line:
  ``naive`` is the text before the cursor (the last ``--budget`` tokens, cut at a line start), its
  decode's first line taken as is; ``context`` is what the server does: ``ContextBuilder`` (imports,
  enclosing headers, nearest code, distant definitions dropped whole, token healing) and the
  server's post-processing. Both run on each case before the next case starts, in an order that
  alternates, so load from other processes hits both alike.
* Cost: prompt tokens, the time to build the prompt, and the prefill time they cost.
* Prefix stability: lines are typed character by character (and on into the next line) and the
  share of each prompt's tokens that the previous keystroke's prompt already had is reported for
  both prompts: what KV-cache reuse across keystrokes can save.

Run ``python -m benchmarks.quality --help``; see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import statistics
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("benchmarks.quality")

LANGUAGES = ("python", "javascript", "c")
SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "__pycache__",
    "encodings",
    "pydoc_data",
    "__tests__",
    "dist",
    "min",
}
MAX_FILE_CHARS = 300_000
MIN_REST_TOKENS = 4
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "quality.json"


# -- corpora -------------------------------------------------------------------------------------
def default_roots() -> dict[str, Path | None]:
    node = shutil.which("node")
    npm = None
    if node:
        for candidate in (
            Path(node).resolve().parent.parent / "lib" / "node_modules" / "npm",
            Path("/usr/lib/node_modules/npm"),
            Path("/usr/share/nodejs/npm"),
        ):
            if candidate.is_dir():
                npm = candidate
                break
    include = Path("/usr/include")
    return {
        "python": Path(sysconfig.get_paths()["stdlib"]),
        "javascript": npm,
        "c": include if include.is_dir() else None,
    }


SUFFIXES = {"python": (".py",), "javascript": (".js", ".mjs", ".cjs"), "c": (".h", ".c")}
LANGUAGE_IDS = {"python": "python", "javascript": "javascript", "c": "c"}


def corpus_files(language: str, root: Path) -> list[tuple[str, Path]]:
    """The corpus's files; of the stdlib only those the draft head was not trained on."""
    from speculative_complete.decoding.draft_head.training import held_out

    found = []
    for path in root.rglob("*"):
        if path.suffix not in SUFFIXES[language] or not path.is_file() or ".min." in path.name:
            continue
        rel = path.relative_to(root)
        if root == Path(sysconfig.get_paths()["stdlib"]) and not held_out(rel.as_posix()):
            continue
        if SKIP_DIRS.isdisjoint(rel.parts[:-1]):
            found.append((rel.as_posix(), path))
    found.sort()
    return found


@dataclass
class Case:
    language: str
    file: str
    line: int  # 1-based
    column: int
    cursor: str  # "line_start" | "mid_line"
    text: str  # the document: the file with the rest of the cursor's line removed
    offset: int
    expected: str  # the line's real rest


def sample_cases(
    language: str, files: Sequence[tuple[str, Path]], n: int, seed: int, count_tokens
) -> list[Case]:
    rng = random.Random(f"{seed}:{language}")
    cases: list[Case] = []
    used: set[tuple[str, int]] = set()
    attempts = 0
    while len(cases) < n and attempts < 50_000 and files:
        attempts += 1
        rel, path = rng.choice(files)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if len(text) > MAX_FILE_CHARS or "\r" in text:
            continue
        lines = text.split("\n")
        if len(lines) < 30:
            continue
        index = rng.randrange(10, len(lines))
        line = lines[index]
        if not line.strip() or (rel, index) in used:
            continue
        indent = len(line) - len(line.lstrip())
        end = len(line.rstrip())
        mid = rng.random() < 0.5 and end - indent > 1
        column = rng.randrange(indent + 1, end) if mid else indent
        expected = line[column:end]
        if count_tokens(expected) < MIN_REST_TOKENS:
            continue
        line_start = sum(len(x) + 1 for x in lines[:index])
        document = text[: line_start + column] + text[line_start + len(line) :]
        used.add((rel, index))
        cases.append(
            Case(
                language,
                rel,
                index + 1,
                column,
                "mid_line" if mid else "line_start",
                document,
                line_start + column,
                expected,
            )
        )
    return cases


# -- scoring -------------------------------------------------------------------------------------
def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def edit_similarity(got: str, want: str) -> float:
    got, want = got.rstrip(), want.rstrip()
    if not got and not want:
        return 1.0
    return 1.0 - levenshtein(got, want) / max(len(got), len(want))


@dataclass
class Run:
    variant: str
    suggestion: str
    exact: bool
    similarity: float
    prompt_tokens: int
    build_ms: float
    prefill_ms: float
    decode_ms: float
    healed: str = ""
    new_tokens: int = 0
    line_log_prob: float | None = None  # where asked for: ``line_log_prob``


@dataclass
class CaseResult:
    case: dict[str, Any]
    runs: dict[str, Run] = field(default_factory=dict)


# -- the two prompts ---------------------------------------------------------------------------------
LOG_PROB_KEY = "line_log_prob"  # the prefix-cache key a scored generation leaves its cache under


class Variants:
    def __init__(self, engine, budget: int, max_new_tokens: int) -> None:
        from speculative_complete.lsp_server.context.builder import ContextBuilder
        from speculative_complete.lsp_server.context.tokens import Tokens

        self.engine, self.budget, self.max_new = engine, budget, max_new_tokens
        self.tokens = Tokens.for_engine(engine)
        self.builder = ContextBuilder()
        # The server's prefill in passes of ~50 ms (its prefill times are reported); False: in
        # passes of ``prefill_chunk`` tokens, up to twice as fast on a large model (the same logits)
        self.paced_prefill = True

    def naive(self, case: Case) -> Run:
        from benchmarks.naive_context import fit_tokens, plain_window
        from speculative_complete.decoding import GenerationConfig
        from speculative_complete.lsp_server.context.builder import ContextRequest

        started = time.perf_counter()
        prompt = plain_window(ContextRequest(case.text, case.offset, self.budget))
        ids = fit_tokens(prompt.text, self.engine.encode, self.budget)
        build_ms = (time.perf_counter() - started) * 1000
        config = GenerationConfig(max_new_tokens=self.max_new, stop_at_newline=True)
        result = self.engine.generate(ids, config)
        suggestion = result.text.split("\n", 1)[0].rstrip()
        return self._run("naive", case, suggestion, len(ids), build_ms, result, "")

    def context_unhealed(self, case: Case) -> Run:
        """The context without token healing: what healing alone is worth."""
        return self.context(case, heal=False)

    def context(
        self,
        case: Case,
        heal: bool = True,
        name: str = "",
        uri: str = "",
        log_prob: bool = False,
        **options: Any,
    ) -> Run:
        """The server's prompt; ``options`` are more of ``ContextRequest``'s fields (``repo_quality``
        gives the project's definitions); ``log_prob``: the true line's too (``line_log_prob``)."""
        from speculative_complete.decoding import GenerationConfig
        from speculative_complete.lsp_server import postprocess
        from speculative_complete.lsp_server.context.builder import ContextRequest
        from speculative_complete.lsp_server.context.languages import detect

        started = time.perf_counter()
        uri = uri or f"file:///corpus/{case.file}"
        language_id = LANGUAGE_IDS[case.language]
        request = ContextRequest(
            case.text, case.offset, self.budget, uri=uri, language_id=language_id, heal=heal, **options
        )
        prompt = self.builder.build(request, self.tokens)
        build_ms = (time.perf_counter() - started) * 1000
        line_start = case.text.rfind("\n", 0, case.offset) + 1
        before = case.text[line_start : case.offset]
        situation = postprocess.situation_for(case.text, case.offset, before, "", detect(None, uri), "never")
        config = GenerationConfig(
            max_new_tokens=self.max_new,
            stop_at_newline=True,
            required_prefix=prompt.healed,
            stop_strings=prompt.stop_strings,
        )
        if not self.paced_prefill:
            config = replace(config, prefill_ms=None)
        result = self.engine.generate(list(prompt.ids), config, cache_key=self._key(log_prob))
        suggestion = postprocess.finish(result.text, situation) or ""
        name = name or ("context" if heal else "context_unhealed")
        run = self._run(name, case, suggestion, len(prompt.ids), build_ms, result, prompt.healed)
        if log_prob:
            cache, cached = self._kept(prompt.ids)
            run.line_log_prob = line_log_prob(
                self.engine, prompt.ids, prompt.healed, case.expected, cache, cached
            )
        return run

    def _key(self, log_prob: bool) -> str | None:
        """The key a generation that is scored too leaves its cache under, where the engine keeps
        caches (``_kept``)."""
        return LOG_PROB_KEY if log_prob and self.engine.prefix_cache is not None else None

    def _kept(self, ids: Sequence[int]) -> tuple[Any, int]:
        """The cache the scored generation left (``_key``), cropped short of the prompt's last token,
        and how many tokens it holds: the prompt is then prefilled once, not twice (on a real model
        the prefill is most of a case's time). None, 0 where the engine keeps no caches."""
        store = self.engine.prefix_cache
        kept = store.take(LOG_PROB_KEY, list(ids)) if store is not None else None
        if kept is None or kept.cache is None:
            return None, 0
        return kept.cache, kept.reused

    @staticmethod
    def _run(
        variant: str, case: Case, suggestion: str, tokens: int, build_ms: float, result, healed: str
    ) -> Run:
        return Run(
            variant,
            suggestion,
            suggestion.rstrip() == case.expected.rstrip(),
            round(edit_similarity(suggestion, case.expected), 4),
            tokens,
            round(build_ms, 2),
            round(result.stats.prefill_ms, 2),
            round(result.stats.decode_ms, 2),
            healed,
            result.stats.new_tokens,
        )


def line_log_prob(
    engine: Any, ids: Sequence[int], healed: str, expected: str, cache: Any = None, cached: int = 0
) -> float:
    """The mean log-probability per token the model gives the true line and its newline after the
    prompt ``ids`` (first the text healing backed up over, unscored), teacher-forced: a finer
    measure than the exact line, which moves by whole cases, and one that scores what a prompt
    makes of the line whatever greedy decoding would have written instead. ``cache``: one that
    holds ``ids[:cached]`` already (``cached`` < ``len(ids)``), fed on from there (and extended)."""
    import torch

    forward = engine.target.forward
    if cache is None or not 0 <= cached < len(ids):
        cache, cached = forward.new_cache(), 0
    line = engine.encode(healed + expected + "\n")
    owed, spelled = 0, 0  # the line's first tokens that only spell the healed text
    for token in line:
        spelled += len(engine.decode([token]))
        if spelled > len(healed):
            break
        owed += 1
    with torch.inference_mode():
        rows = [forward(list(ids[cached:]), cache, keep=1)]
        if len(line) > 1:
            rows.append(forward(line[:-1], cache))
        scores = torch.log_softmax(torch.cat(rows).float(), -1)
    picked = scores[torch.arange(len(line)), torch.tensor(line)]
    return round(float(picked[owed:].mean()), 4)


# -- keystrokes ------------------------------------------------------------------------------------
def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def keystroke_share(variants: Variants, cases: Sequence[Case], lines_per_language: int) -> dict[str, Any]:
    """Type each sampled line from its indentation to its end, then the next line's first
    characters; for each keystroke, the share of the prompt's tokens shared with the previous one."""
    from benchmarks.naive_context import fit_tokens, plain_window
    from speculative_complete.lsp_server.context.builder import ContextRequest

    totals = {"naive": [0, 0], "context": [0, 0]}
    keystrokes = 0
    per_language: dict[str, int] = {}
    for case in cases:
        if per_language.get(case.language, 0) >= lines_per_language:
            continue
        per_language[case.language] = per_language.get(case.language, 0) + 1
        line_start = case.text.rfind("\n", 0, case.offset) + 1
        before = case.text[line_start : case.offset]
        indent = before[: len(before) - len(before.lstrip())]
        typed = (before + case.expected)[len(indent) :] + "\n" + indent
        previous: dict[str, list[int]] = {}
        base = case.text[:line_start] + indent
        rest = case.text[case.offset :]
        uri = f"file:///corpus/{case.file}"
        for k in range(len(typed) + 1):
            text = base + typed[:k] + rest
            offset = len(base) + k
            naive = fit_tokens(
                plain_window(ContextRequest(text, offset, variants.budget)).text,
                variants.engine.encode,
                variants.budget,
            )
            request = ContextRequest(
                text, offset, variants.budget, uri=uri, language_id=LANGUAGE_IDS[case.language]
            )
            context = list(variants.builder.build(request, variants.tokens).ids)
            for name, ids in (("naive", naive), ("context", context)):
                if name in previous and ids:
                    totals[name][0] += common_prefix(previous[name], ids)
                    totals[name][1] += len(ids)
                previous[name] = ids
            keystrokes += 1
    return {
        "keystrokes": keystrokes,
        "lines": sum(per_language.values()),
        **{name: round(shared / total, 4) if total else None for name, (shared, total) in totals.items()},
    }


# -- reporting -------------------------------------------------------------------------------------
def summarize(results: Sequence[CaseResult], variants: Sequence[str]) -> dict[str, Any]:
    groups: dict[str, list[CaseResult]] = {"all": list(results)}
    for r in results:
        groups.setdefault(r.case["language"], []).append(r)
        groups.setdefault(f"cursor={r.case['cursor']}", []).append(r)
    out: dict[str, Any] = {}
    for group, members in groups.items():
        out[group] = {"n": len(members)}
        for v in variants:
            runs = [m.runs[v] for m in members if v in m.runs]
            if not runs:
                continue
            out[group][v] = {
                "exact": round(sum(r.exact for r in runs) / len(runs), 4),
                "edit_similarity": round(statistics.fmean(r.similarity for r in runs), 4),
                "prompt_tokens_mean": round(statistics.fmean(r.prompt_tokens for r in runs), 1),
                "build_ms_median": round(statistics.median(r.build_ms for r in runs), 2),
                "prefill_ms_median": round(statistics.median(r.prefill_ms for r in runs), 1),
                "prefill_ms_mean": round(statistics.fmean(r.prefill_ms for r in runs), 1),
                "empty": round(sum(not r.suggestion.strip() for r in runs) / len(runs), 4),
            }
    return out


def print_summary(summary: dict[str, Any], variants: Sequence[str], share: dict[str, Any] | None) -> None:
    header = f"{'group':<20} {'n':>4}  " + "  ".join(
        f"{v + ' exact':>14} {'edit sim':>8} {'tokens':>7} {'prefill':>8}" for v in variants
    )
    print(header)
    for group, row in summary.items():
        cells = []
        for v in variants:
            s = row.get(v)
            cells.append(
                f"{s['exact']:>14.3f} {s['edit_similarity']:>8.3f} {s['prompt_tokens_mean']:>7.0f} "
                f"{s['prefill_ms_median']:>6.0f}ms"
                if s
                else " " * 42
            )
        print(f"{group:<20} {row['n']:>4}  " + "  ".join(cells))
    if share:
        print(
            f"\nshared token prefix with the previous keystroke's prompt ({share['keystrokes']} keystrokes "
            f"over {share['lines']} lines): naive {share['naive']}, context {share['context']}"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="cursor positions per language")
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--budget", type=int, default=512, help="prompt tokens, both prompts")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--keystroke-lines",
        type=int,
        default=4,
        help="lines typed per language for the prefix-share measurement (0: skip)",
    )
    parser.add_argument(
        "--root",
        action="append",
        default=[],
        metavar="LANG=DIR",
        help="the corpus of a language (default: stdlib, npm, /usr/include)",
    )
    parser.add_argument(
        "--variants",
        default="naive,context",
        help="prompts to compare: naive, context, context_unhealed (context, no healing)",
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from speculative_complete.decoding import SpeculativeEngine, load_model

    roots = default_roots()
    for item in args.root:
        lang, _, folder = item.partition("=")
        roots[lang] = Path(folder)
    languages = [lang for lang in args.languages.split(",") if lang]
    model = load_model(args.model, device="cpu", dtype="float32")
    engine = SpeculativeEngine(model)
    variants = Variants(engine, args.budget, args.max_new_tokens)
    names = tuple(v for v in args.variants.split(",") if v)
    unknown = set(names) - {"naive", "context", "context_unhealed"}
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")

    cases: list[Case] = []
    for lang in languages:
        root = roots.get(lang)
        if root is None or not root.is_dir():
            print(f"{lang}: no corpus found, skipped", file=sys.stderr)
            continue
        found = sample_cases(lang, corpus_files(lang, root), args.n, args.seed, variants.tokens.count)
        print(f"{lang}: {len(found)} cases from {root}", file=sys.stderr)
        cases.extend(found)

    engine.generate(engine.encode("def warm_up():\n    return"), None)  # first-call overheads
    results: list[CaseResult] = []
    started = time.perf_counter()
    for i, case in enumerate(cases):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotated per case
        record = CaseResult({k: v for k, v in asdict(case).items() if k != "text"})
        for name in order:
            record.runs[name] = getattr(variants, name)(case)
        results.append(record)
        if (i + 1) % 10 == 0:
            print(f"{i + 1}/{len(cases)} cases, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    share = keystroke_share(variants, cases, args.keystroke_lines) if args.keystroke_lines > 0 else None
    summary = summarize(results, names)
    print_summary(summary, names, share)
    out = {
        "benchmark": "quality",
        "model": model.source,
        "budget": args.budget,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "n_per_language": args.n,
        "languages": languages,
        "roots": {k: str(v) for k, v in roots.items() if k in languages},
        "summary": summary,
        "keystroke_prefix_share": share,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "cases": [{**r.case, "runs": {k: asdict(v) for k, v in r.runs.items()}} for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return out


if __name__ == "__main__":
    main()
