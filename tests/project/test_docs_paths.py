"""Every repository path the documentation names exists, so a moved or renamed module cannot
leave the docs pointing at nothing.

The docs read here are ``README.md``, ``docs/*.md`` and ``benchmarks/README.md`` (``CHANGELOG.md``
is history: it names what was true on its dates). What counts as a repository path:

- an inline code span that is one path under a top folder of the repository
  (``speculative_complete/``, ``benchmarks/``, ``tests/``, ``editors/``, ``docs/``, ``.ci/``); or
  one whose first folder is beside the doc (``results/`` in ``benchmarks/README.md``) or inside a
  package or a top folder (``drafters/ngram.py``, ``context/``), which must exist there; a
  trailing ``:LINE`` must be a line of that file, and a ``*`` must match at least one file; one
  under ``decoding/`` or ``lsp_server/``, top folders until they moved under
  ``speculative_complete/``, is reported as moved;
- a Markdown link or image to a relative target, resolved from the doc's folder as a renderer
  does, with its ``#anchor`` checked against the target's headings;
- a dotted name under ``speculative_complete`` or ``benchmarks`` at the start of a code span
  (``speculative_complete.decoding.engine.healing.back_up``): the module, and the name it defines
  (read from its source, not imported), and a class's member after it; one under the old
  top-level ``decoding`` or ``lsp_server`` names no module;
- ``python -m MODULE`` of those packages (the old ``decoding`` and ``lsp_server`` too), in code
  spans and code blocks: a module or a package with a ``__main__``;
- in code blocks, a word that is a path under a top folder, except the file a command writes
  (after ``--out``).

Not repository paths, and skipped on purpose: paths on a user's machine (``~/``, ``$XDG_...``,
``/tmp``, any absolute path), placeholders (anything with ``<``, ``>``, ``$`` or ``{``),
abbreviations (``...``), URLs, bare file names without a folder, and the names in ``NOT_PATHS``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md")
TOP_FOLDERS = ("speculative_complete", "benchmarks", "tests", "editors", "docs", ".ci")
# Where a path's first folder may also sit (``drafters/ngram.py``): the packages and the top folders
SEARCHED = ("speculative_complete/decoding", "speculative_complete/lsp_server", *TOP_FOLDERS[1:])
PACKAGES = ("speculative_complete", "benchmarks")
# Top-level packages and folders until they moved under speculative_complete (issue 74): what a doc
# still names under them is reported.
MOVED = ("decoding", "lsp_server")
NOT_PATHS = {  # names the docs write like paths that are not files: each with what it is
    "lsp_server/stats": "the server's own LSP request",
    "lsp_server/load/": "the start of a load's progress token",
    "lsp_server.accepted": "the command a client runs when an item is accepted",
}

CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")
RUN_MODULE = re.compile(r"python3? -m ([\w.]+)")
DOTTED = re.compile(rf"^((?:{'|'.join(PACKAGES + MOVED)})(?:\.[A-Za-z_]\w*)+)(?:\(|$)")
LINE_SUFFIX = re.compile(r"^(.*\.\w+):(\d+)$")
OUTPUT_FLAGS = ("--out", "-o", ">")


@dataclass(frozen=True)
class Mention:
    """One thing a doc names that must exist in the repository."""

    doc: Path
    line: int
    kind: str  # "path", "link", "module", "name"
    text: str  # as the doc writes it

    def where(self) -> str:
        return f"{_shown(self.doc)}:{self.line}: {self.kind} {self.text!r}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# -- finding mentions -----------------------------------------------------------------------------


def mentions(doc: Path) -> list[Mention]:
    """Everything ``doc`` names that the rules in the module's docstring make a repository path."""
    found: list[Mention] = []
    in_block = False
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if FENCE.match(line):
            in_block = not in_block
            continue
        texts = _block_mentions(line) if in_block else _prose_mentions(doc, line)
        found += [Mention(doc, number, kind, text) for kind, text in texts]
    return found


def _prose_mentions(doc: Path, line: str) -> list[tuple[str, str]]:
    found = [("link", target) for target in LINK.findall(line) if _is_relative_link(target)]
    for span in CODE_SPAN.findall(line):
        found += [("module", module) for module in RUN_MODULE.findall(span) if _ours(module)]
        dotted = DOTTED.match(span.strip())
        if dotted and dotted.group(1) not in NOT_PATHS:
            found.append(("name", dotted.group(1)))
        elif _looks_like_path(doc, span.strip()):
            found.append(("path", span.strip()))
    return found


def _block_mentions(line: str) -> list[tuple[str, str]]:
    found = [("module", module) for module in RUN_MODULE.findall(line) if _ours(module)]
    words = line.split("#", 1)[0].split()
    for before, word in zip(["", *words], words, strict=False):
        word = word.strip("'\";,()").rstrip(":")
        if before not in OUTPUT_FLAGS and _under_top_folder(word) and _repository_path(word):
            found.append(("path", word))
    return found


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES + MOVED


def _is_relative_link(target: str) -> bool:
    return not re.match(r"^[a-z]+:", target) and not _off_repository(target.split("#")[0] or "x")


def _off_repository(text: str) -> bool:
    """A path on a user's machine, a placeholder or an abbreviation: never a repository path."""
    return text.startswith(("~", "/", "$")) or any(mark in text for mark in ("<", ">", "$", "{", "..."))


def _under_top_folder(text: str) -> bool:
    return any(text.startswith(f"{folder}/") for folder in TOP_FOLDERS)


def _moved(text: str) -> bool:
    return any(text.startswith(f"{folder}/") for folder in MOVED)


def _repository_path(text: str) -> bool:
    return not _off_repository(text) and text not in NOT_PATHS


def _looks_like_path(doc: Path, span: str) -> bool:
    if " " in span or "/" not in span or not _repository_path(span):
        return False
    return _under_top_folder(span) or _moved(span) or bool(_bases(doc, span))


def _bases(doc: Path, path: str) -> list[Path]:
    """The folders ``path`` is read from: the repository's root for a path under a top folder;
    else the doc's own folder where the path's first folder is beside the doc, and every package
    or top folder holding a folder of that name (``drafters/ngram.py`` is
    ``speculative_complete/decoding/drafters/ngram.py``)."""
    if _under_top_folder(path):
        return [ROOT]
    first = path.split("/")[0]
    beside = [doc.parent] if doc.parent != ROOT and (doc.parent / first).is_dir() else []
    return beside + [ROOT / folder for folder in SEARCHED if (ROOT / folder / first).is_dir()]


# -- checking them ---------------------------------------------------------------------------------


def missing(mention: Mention) -> str | None:
    """Why ``mention`` names nothing in the repository, or None where it does."""
    if mention.kind == "module":
        return None if _module_runs(mention.text) else "no such module to run"
    if mention.kind == "name":
        return _name_missing(mention.text)
    if mention.kind == "link":
        return _link_missing(mention.doc, mention.text)
    return _path_missing(mention.doc, mention.text)


def _path_missing(doc: Path, text: str) -> str | None:
    if _moved(text):
        return "moved: now under speculative_complete/"
    line = None
    with_line = LINE_SUFFIX.match(text)
    if with_line:
        text, line = with_line.group(1), int(with_line.group(2))
    bases = _bases(doc, text)
    if "*" in text:
        return None if any(list(base.glob(text)) for base in bases) else "no file matches"
    path = next((base / text for base in bases if (base / text).exists()), None)
    if path is None:
        return "no such file or folder"
    if line is not None and line > len(path.read_text().splitlines()):
        return f"the file has no line {line}"
    return None


def _link_missing(doc: Path, target: str) -> str | None:
    file, _, anchor = target.partition("#")
    path = (doc.parent / file) if file else doc
    if not path.exists():
        return "no such file or folder"
    if anchor and path.suffix == ".md" and anchor not in heading_anchors(path.read_text()):
        return f"{_shown(path.resolve())} has no heading #{anchor}"
    return None


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated one numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    in_block = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_block = not in_block
        heading = None if in_block else re.match(r"^#{1,6} (.*?)\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _module_file(parts: list[str]) -> Path | None:
    """The source of the module ``parts`` name: ``a/b.py`` or ``a/b/__init__.py``."""
    path = ROOT.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_runs(module: str) -> bool:
    source = _module_file(module.split("."))
    return source is not None and (source.name != "__init__.py" or (source.parent / "__main__.py").is_file())


def _name_missing(dotted: str) -> str | None:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        source = _module_file(parts[:split])
        if source is not None:
            break
    else:
        return "no such module"
    rest = parts[split:]
    if not rest:
        return None
    tree = ast.parse(source.read_text())
    owner = _defined(tree.body, rest[0])
    if owner is None:
        return f"{_shown(source)} defines no {rest[0]}"
    if len(rest) > 1 and isinstance(owner, ast.ClassDef) and _defined(owner.body, rest[1]) is None:
        return f"{rest[0]} in {_shown(source)} defines no {rest[1]}"
    return None


def _defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` that binds ``name``."""
    return next((node for node in body if name in _bound_names(node)), None)


def _bound_names(node: ast.stmt) -> set[str]:
    """The names a def, a class, an assignment or an import binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {target.id for target in targets if isinstance(target, ast.Name)}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return set()


# -- the tests -------------------------------------------------------------------------------------


def test_every_repository_path_the_docs_name_exists() -> None:
    found = [mention for doc in DOCS for mention in mentions(doc)]
    kinds = {mention.kind for mention in found}
    assert kinds == {"path", "link", "module", "name"}, f"the docs' scan found only {sorted(kinds)}"
    problems = [f"{mention.where()}: {why}" for mention in found if (why := missing(mention))]
    assert problems == [], f"{len(problems)} paths the docs name are not in the repository:\n" + "\n".join(
        problems
    )


def test_a_missing_path_is_reported_with_its_doc_and_line_and_machine_paths_are_not(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "# A page\n\n"
        "See `speculative_complete/decoding/engine/loop.py`,"
        " `speculative_complete/lsp_server/no_such_module.py` and [the top](#a-page).\n"
        "Caches: `~/.cache/lsp-speculative-complete/`, `$XDG_CACHE_HOME/x`, `/tmp/prompt.py`, `<dir>/x.py`.\n"
        "`speculative_complete.decoding.engine.healing.back_up`, "
        "`speculative_complete.decoding.engine.healing.no_such_name`, [gone](#nowhere)\n"
        "```bash\npython -m benchmarks.no_such_bench --out benchmarks/results/new.json\n"
        "python -m pytest -q tests/no_such_test.py\n```\n"
        "Moved: `lsp_server/config.py`, `decoding.engine.healing.back_up`, `python -m lsp_server`.\n"
    )
    problems = [mention.where() for mention in mentions(doc) if missing(mention)]
    shown = _shown(doc)
    assert problems == [
        f"{shown}:3: path 'speculative_complete/lsp_server/no_such_module.py'",
        f"{shown}:5: link '#nowhere'",
        f"{shown}:5: name 'speculative_complete.decoding.engine.healing.no_such_name'",
        f"{shown}:7: module 'benchmarks.no_such_bench'",
        f"{shown}:8: path 'tests/no_such_test.py'",
        f"{shown}:10: path 'lsp_server/config.py'",
        f"{shown}:10: name 'decoding.engine.healing.back_up'",
        f"{shown}:10: module 'lsp_server'",
    ]


def test_a_line_number_past_the_file_end_is_missing() -> None:
    config = "speculative_complete/lsp_server/config.py"
    lines = len((ROOT / config).read_text().splitlines())
    last, past = (Mention(DOCS[0], 1, "path", f"{config}:{n}") for n in (lines, lines + 1))
    assert missing(last) is None
    assert missing(past) == f"the file has no line {lines + 1}"


def test_anchors_follow_githubs_rule() -> None:
    text = (
        "# Benchmarks\n## `load.py`: N editors on one engine\n"
        "## `replicas.py`: shape-true Qwen2.5-Coder replicas\n## On a GPU\n## On a GPU\n"
    )
    assert heading_anchors(text) == {
        "benchmarks",
        "loadpy-n-editors-on-one-engine",
        "replicaspy-shape-true-qwen25-coder-replicas",
        "on-a-gpu",
        "on-a-gpu-1",
    }
