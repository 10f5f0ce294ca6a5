"""Which definitions from other files a prompt shows: those of the names used near the cursor.

The names are the identifiers of the lines above the cursor's, nearest line first, then those the
document imports (a name imported at the top is often the one the next line calls). The cursor's
own line is left out, as for the snippets: the choice then does not change while the user types on
one line, and the KV cache keeps the prompt's prefix. For each name, in that order:

- its definitions in other files, the nearest file first (the longest shared folder path), where
  at most ``MAX_DEFINERS`` files define it (a name defined everywhere, ``run`` or ``__init__``,
  says nothing about which is meant);
- a class comes with its methods' signatures (what a call on an instance of it can use), a method
  with its class's header;
- a name that is a module of the project (``import ledger`` or ``from pkg import ledger``) brings
  that module's top-level definitions (its classes and functions before its variables), after
  every name's own definitions.

Definitions are taken while their estimated cost fits the budget; the chosen ones of a file form
one excerpt, in file order, as a stub of that file would read.

A document keeps its last choice while no new name with a definition elsewhere comes near the
cursor (``Chooser``): chosen afresh for every line, the window of lines above would slide past a
name or reorder two, and a different choice changes the prompt from its first tokens, a prefill
of all of it at the start of each line.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from lsp_server.context.languages import uri_path
from lsp_server.context.snippets import Snippet, identifiers
from lsp_server.context.symbols import Definition, FileSymbols, SymbolTable

NEAR_LINES = 20
MAX_DEFINERS = 3
MAX_IMPORT_LINES = 400  # lines from the top searched for imports
FILE_HEADER_TOKENS = 16  # a file's header or path in the prompt, as estimated before it is rendered
MAX_MEMBERS = 12
_IMPORT_LINE = re.compile(r"^\s*(from\s|import\s|use\s|#\s*include|using\s|.*\brequire\()")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Project:
    """The definitions a request may draw on: the workspace's table, with the open documents' own
    (``overlay``: newer than what is on disk) in place of their files'."""

    table: SymbolTable
    overlay: SymbolTable = field(default_factory=SymbolTable)

    @functools.cached_property
    def _fresh(self) -> frozenset[str]:
        return frozenset(uri_path(uri) for uri in self.overlay.files)

    def definitions(self, name: str) -> list[tuple[FileSymbols, Definition]]:
        found = [(f, d) for f, d in self.table.definitions(name) if uri_path(f.uri) not in self._fresh]
        return found + self.overlay.definitions(name)

    def modules(self, name: str) -> list[FileSymbols]:
        found = [self.table.files[uri] for uri in self.table.by_module.get(name, ())]
        found = [f for f in found if uri_path(f.uri) not in self._fresh]
        return found + [self.overlay.files[uri] for uri in self.overlay.by_module.get(name, ())]


def names_near(lines: Sequence[str], row: int) -> list[str]:
    """The names the request asks about, most telling first: the lines above the cursor's, nearest
    first, then the imports above it."""
    names: list[str] = []
    for line in reversed(lines[max(0, row - NEAR_LINES) : row]):
        names += _words(line)
    for line in lines[: min(row, MAX_IMPORT_LINES)]:
        if _IMPORT_LINE.match(line):
            names += _words(line)
    return list(dict.fromkeys(names))


def _words(line: str) -> list[str]:
    """A line's identifiers, in order, without the keywords and words every program has."""
    wanted = identifiers(line)
    return [w for w in _WORD.findall(line) if w in wanted]


def choose(
    project: Project, uri: str, names: Iterable[str], cost: Callable[[str], int], budget: int
) -> list[Snippet]:
    """Excerpts of definitions (one per file) for ``names``, within ``budget`` as ``cost`` counts,
    files in the order their first definition was chosen; none from ``uri`` itself."""
    here = uri_path(uri)
    shown: dict[str, dict[int, str]] = {}  # by file: line -> text
    files: dict[str, FileSymbols] = {}
    left = budget
    for symbols, entries in _candidates(project, here, names):
        page = shown.get(symbols.uri, {})
        new = {line: text for line, text in entries.items() if line not in page}
        if not new:
            continue
        spend = sum(cost(text) + text.count("\n") + 2 for text in new.values())  # comment marks
        spend += 0 if page else FILE_HEADER_TOKENS
        if spend > left:
            continue
        shown[symbols.uri] = {**page, **new}
        files[symbols.uri] = symbols
        left -= spend
    return [_excerpt(files[uri], page) for uri, page in shown.items()]


@dataclass(frozen=True)
class Choice:
    names: frozenset[str]  # the names near the cursor that had definitions elsewhere
    table: SymbolTable
    overlay: SymbolTable
    budget: int
    excerpts: tuple[Snippet, ...]


class Chooser:
    """Each document's last choice, kept while the names near the cursor that have definitions
    elsewhere are among those it was made for, and the tables and budget are the same (one
    thread)."""

    def __init__(self) -> None:
        self._last: dict[str, Choice] = {}

    def choose(
        self, project: Project, uri: str, names: Sequence[str], cost: Callable[[str], int], budget: int
    ) -> list[Snippet]:
        here = uri_path(uri)
        found = frozenset(n for n in names if _definers(project, here, n) or _modules(project, here, n))
        last = self._last.get(uri)
        if (
            last is not None
            and found <= last.names
            and last.table is project.table  # replaced whole when a file changes
            and last.overlay is project.overlay
            and last.budget == budget
        ):
            return list(last.excerpts)
        excerpts = choose(project, uri, names, cost, budget)
        if uri:
            self._last[uri] = Choice(found, project.table, project.overlay, budget, tuple(excerpts))
        return excerpts

    def forget(self, uri: str) -> None:
        self._last.pop(uri, None)


def _definers(project: Project, here: str, name: str) -> list[tuple[FileSymbols, Definition]]:
    """``name``'s definitions in files other than ``here``; none where too many files define it."""
    found = [(f, d) for f, d in project.definitions(name) if uri_path(f.uri) != here]
    return found if len({f.uri for f, _ in found}) <= MAX_DEFINERS else []


def _modules(project: Project, here: str, name: str) -> list[FileSymbols]:
    return [m for m in project.modules(name) if uri_path(m.uri) != here]


def _candidates(
    project: Project, here: str, names: Iterable[str]
) -> Iterable[tuple[FileSymbols, dict[int, str]]]:
    """What each name would add to the prompt, best first: (file, {line: text})."""
    modules: list[FileSymbols] = []
    for name in names:
        found = _definers(project, here, name)
        if found:
            symbols, definition = min(found, key=lambda fd: (-_shared_folders(fd[0].uri, here), fd[0].uri))
            yield symbols, _entries(symbols, definition)
        modules += _modules(project, here, name)
    for module in modules:  # what is called first, then the module's variables
        for definition in sorted(module.top_level(), key=lambda d: d.kind == "variable"):
            yield module, {definition.line: definition.text}


def _entries(symbols: FileSymbols, definition: Definition) -> dict[int, str]:
    """The lines a definition shows: a class with its methods, a method under its class's header."""
    entries = {definition.line: definition.text}
    if definition.kind == "class":
        members = [m for m in symbols.members(definition.name) if _public(m.name)][:MAX_MEMBERS]
        entries.update((m.line, m.text) for m in members)
    elif definition.container:
        owners = (d for d in symbols.definitions if d.name == definition.container and not d.container)
        owner = next(owners, None)
        if owner is not None:
            entries[owner.line] = owner.text
    return entries


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _shared_folders(uri: str, here: str) -> int:
    a, b = uri_path(uri).split("/")[:-1], here.split("/")[:-1]
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def _excerpt(symbols: FileSymbols, page: dict[int, str]) -> Snippet:
    lines = sorted(page)
    return Snippet(symbols.uri, lines[0], "\n".join(page[line] for line in lines), 1.0, "definition")
