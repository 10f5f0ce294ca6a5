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
_IMPORT_STARTS = ("from ", "import ", "use ", "#include", "# include", "using ")
MAX_MODULE_DEFINITIONS = 40  # of one module's top-level definitions, the first in file order
MIN_ENTRY_TOKENS = 8  # less budget left than this: no definition fits
CHARS_PER_TOKEN = 3  # an estimate on the safe side: code averages 3.5-4 characters a token
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Project:
    """The definitions a request may draw on: the workspace's table, with the open documents' own
    (``overlay``: newer than what is on disk) in place of their files'."""

    table: SymbolTable
    overlay: SymbolTable = field(default_factory=SymbolTable)

    @functools.cached_property
    def _fresh(self) -> frozenset[str]:
        return frozenset(_path(uri) for uri in self.overlay.files)

    def definitions(self, name: str) -> list[tuple[FileSymbols, Definition]]:
        found = [(f, d) for f, d in self.table.definitions(name) if _path(f.uri) not in self._fresh]
        return found + self.overlay.definitions(name)

    def modules(self, name: str) -> list[FileSymbols]:
        found = [self.table.files[uri] for uri in self.table.by_module.get(name, ())]
        found = [f for f in found if _path(f.uri) not in self._fresh]
        return found + [self.overlay.files[uri] for uri in self.overlay.by_module.get(name, ())]


def names_near(lines: Sequence[str], row: int) -> list[str]:
    """The names the request asks about, most telling first: the lines above the cursor's, nearest
    first, then the imports above it."""
    names: list[str] = []
    for line in reversed(lines[max(0, row - NEAR_LINES) : row]):
        names += _words(line)
    return list(dict.fromkeys(names + imported_names(lines[: min(row, MAX_IMPORT_LINES)])))


def imported_names(lines: Sequence[str]) -> list[str]:
    """The names import lines mention, an import's continuation lines included (Python's
    ``from x import (`` ... ``)``, JavaScript's ``import {`` ... ``}``)."""
    names: list[str] = []
    open_brackets = 0
    for line in lines:
        stripped = line.lstrip()
        if open_brackets > 0 or stripped.startswith(_IMPORT_STARTS) or "require(" in stripped:
            names += _words(line)
            open_brackets = max(0, open_brackets + line.count("(") + line.count("{"))
            open_brackets = max(0, open_brackets - line.count(")") - line.count("}"))
    return names


def estimate(text: str) -> int:
    """Tokens ``text`` costs, estimated from its length: tokenizing each candidate would cost more
    than the rest of the choice, and the builder fits the chosen excerpts with exact counts (an
    excerpt over its share loses lines from its end)."""
    return len(text) // CHARS_PER_TOKEN + 1


def _words(line: str) -> list[str]:
    """A line's identifiers, in order, without the keywords and words every program has."""
    wanted = identifiers(line)
    return [w for w in _WORD.findall(line) if w in wanted]


def choose(
    project: Project, uri: str, names: Iterable[str], cost: Callable[[str], int], budget: int
) -> list[Snippet]:
    """Excerpts of definitions (one per file) for ``names``, within ``budget`` as ``cost`` counts,
    files in the order their first definition was chosen; none from ``uri`` itself. They are
    chosen by ``estimate``; where that was short, the last chosen go until ``cost`` agrees."""
    here = _path(uri)
    picked: list[tuple[FileSymbols, dict[int, str]]] = []  # in the order chosen
    shown: set[tuple[str, int]] = set()
    left = budget
    for symbols, alternatives in _candidates(project, here, names):
        if left < MIN_ENTRY_TOKENS:
            break
        first = all(f.uri != symbols.uri for f, _ in picked)
        for entries in alternatives:  # the fullest that fits
            new = {line: text for line, text in entries.items() if (symbols.uri, line) not in shown}
            spend = _spend(new.values(), estimate, first=first)
            if new and spend <= left:
                picked.append((symbols, new))
                shown.update((symbols.uri, line) for line in new)
                left -= spend
                break
    while picked and _cost(picked, cost) > budget:
        picked.pop()
    return _excerpts(picked)


def _spend(texts: Iterable[str], cost: Callable[[str], int], first: bool) -> int:
    """What entries cost in the prompt: their text, a comment mark per line, a file's header."""
    return sum(cost(text) + text.count("\n") + 2 for text in texts) + (FILE_HEADER_TOKENS if first else 0)


def _cost(picked: Sequence[tuple[FileSymbols, dict[int, str]]], cost: Callable[[str], int]) -> int:
    return sum(_spend([excerpt.text], cost, first=True) for excerpt in _excerpts(picked))


def _excerpts(picked: Sequence[tuple[FileSymbols, dict[int, str]]]) -> list[Snippet]:
    """One excerpt per file, files in the order of their first pick, entries in file order."""
    pages: dict[str, dict[int, str]] = {}
    files: dict[str, FileSymbols] = {}
    for symbols, entries in picked:
        pages.setdefault(symbols.uri, {}).update(entries)
        files[symbols.uri] = symbols
    return [_excerpt(files[uri], page) for uri, page in pages.items()]


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
        here = _path(uri)
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
    found = [(f, d) for f, d in project.definitions(name) if _path(f.uri) != here]
    return found if len({f.uri for f, _ in found}) <= MAX_DEFINERS else []


def _modules(project: Project, here: str, name: str) -> list[FileSymbols]:
    return [m for m in project.modules(name) if _path(m.uri) != here]


def _candidates(
    project: Project, here: str, names: Iterable[str]
) -> Iterable[tuple[FileSymbols, list[dict[int, str]]]]:
    """What each name would add to the prompt, best first: (file, [{line: text}, ...]), each
    with the ways it can be shown, the fullest first."""
    modules: list[FileSymbols] = []
    for name in names:
        found = _definers(project, here, name)
        if found:
            symbols, definition = min(found, key=lambda fd: (-_shared_folders(fd[0].uri, here), fd[0].uri))
            yield symbols, _entries(symbols, definition)
        modules += _modules(project, here, name)
    for module in modules:  # what is called first, then the module's variables
        top_level = sorted(module.top_level(), key=lambda d: d.kind == "variable")
        for definition in top_level[:MAX_MODULE_DEFINITIONS]:
            yield module, [{definition.line: definition.text}]


def _entries(symbols: FileSymbols, definition: Definition) -> list[dict[int, str]]:
    """The lines a definition shows, the fullest first: a class with its methods, else with its
    constructor, else alone; a method under its class's header."""
    entries = {definition.line: definition.text}
    if definition.kind == "class":
        members = [m for m in symbols.members(definition.name) if _public(m.name)][:MAX_MEMBERS]
        constructors = [m for m in members if m.name == "__init__"]
        return [{**entries, **{m.line: m.text for m in shown}} for shown in (members, constructors, [])]
    if definition.container:
        owners = (d for d in symbols.definitions if d.name == definition.container and not d.container)
        owner = next(owners, None)
        if owner is not None:
            entries[owner.line] = owner.text
    return [entries]


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _shared_folders(uri: str, here: str) -> int:
    a, b = _path(uri).split("/")[:-1], here.split("/")[:-1]
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    return shared


def _excerpt(symbols: FileSymbols, page: dict[int, str]) -> Snippet:
    lines = sorted(page)
    return Snippet(symbols.uri, lines[0], "\n".join(page[line] for line in lines), 1.0, "definition")


_path = functools.lru_cache(maxsize=1 << 16)(uri_path)  # a URI's path, parsed once
