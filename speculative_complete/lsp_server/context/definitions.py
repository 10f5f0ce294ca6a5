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

Breadth first: every name in that order gets its bare signature (one line, no docstring) while
the budget lasts, and only then, in the same order, its fuller form (the docstring's line, a
class's methods). A class with its methods would otherwise fill the share before the next name
showed its one line, and the name the next line goes on to use is seldom the nearest one. The
chosen lines of a file form one excerpt, in file order, as a stub of that file would read.

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

from speculative_complete.lsp_server.context.languages import uri_path
from speculative_complete.lsp_server.context.snippets import Snippet, identifiers
from speculative_complete.lsp_server.context.symbols import Definition, FileSymbols, SymbolTable

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
    files in the order their first definition was chosen; none from ``uri`` itself.

    Breadth first: every name, in order, gets its barest form (signatures alone) while it fits;
    then each, in the same order, its fullest form that fits (docstrings, a class's methods): a
    class with its methods would otherwise fill the share before the next name's one line. The
    choice is by ``estimate``; where that was short, the last choices are undone until ``cost``
    agrees."""
    pages = _Pages(budget)
    files: dict[str, FileSymbols] = {}
    picked: list[tuple[str, list[dict[int, str]]]] = []
    for symbols, forms in _candidates(project, _path(uri), names):
        if budget - pages.spent < MIN_ENTRY_TOKENS:
            break
        if pages.add(symbols.uri, forms[-1]):
            files[symbols.uri] = symbols
            picked.append((symbols.uri, forms))
    for path, forms in picked:
        for form in forms[:-1]:  # the fullest that fits
            if pages.add(path, form):
                break
    while pages.undo and _cost(pages.lines, files, cost) > budget:
        pages.pop()
    return [_excerpt(files[path], page) for path, page in pages.lines.items()]


@dataclass
class _Pages:
    """The lines chosen of each file (``{uri: {line: text}}``, files in the order first chosen),
    their estimated cost, and what each addition replaced, so that the last can be undone."""

    budget: int
    lines: dict[str, dict[int, str]] = field(default_factory=dict)
    spent: int = 0
    undo: list[tuple[str, dict[int, str] | None, int]] = field(default_factory=list)

    def add(self, uri: str, form: dict[int, str]) -> bool:
        """Show ``form``'s lines (a line's fuller text in place of a barer one) where they fit."""
        page = self.lines.get(uri)
        old = page or {}
        grown = {**old, **{line: text for line, text in form.items() if len(text) > len(old.get(line, ""))}}
        before = _spend(old.values(), estimate) if page else 0
        spent = self.spent + _spend(grown.values(), estimate) - before
        if grown == old or spent > self.budget:
            return False
        self.undo.append((uri, page, self.spent))
        self.lines[uri], self.spent = grown, spent
        return True

    def pop(self) -> None:
        uri, page, self.spent = self.undo.pop()
        if page is None:
            del self.lines[uri]
        else:
            self.lines[uri] = page


def _spend(texts: Iterable[str], cost: Callable[[str], int]) -> int:
    """What a file's entries cost in the prompt: their text, a comment mark per line, a header."""
    return sum(cost(text) + text.count("\n") + 2 for text in texts) + FILE_HEADER_TOKENS


def _cost(pages: dict[str, dict[int, str]], files: dict[str, FileSymbols], cost: Callable[[str], int]) -> int:
    return sum(_spend([_excerpt(files[path], page).text], cost) for path, page in pages.items())


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
            yield module, [{definition.line: definition.text}, _bare([definition])]


def _entries(symbols: FileSymbols, definition: Definition) -> list[dict[int, str]]:
    """The lines a definition shows, the fullest first: a class with its methods, else with its
    constructor, else alone; a method under its class's header. Last, the barest: a class's
    header and its constructor's, a function's or method's signature, without docstrings."""
    if definition.kind == "class":
        members = [m for m in symbols.members(definition.name) if _public(m.name)][:MAX_MEMBERS]
        constructors = [m for m in members if m.name == "__init__"]
        forms = [[definition, *shown] for shown in (members, constructors, [])]
        return [_full(form) for form in forms] + [_bare([definition, *constructors])]
    shown = [definition]
    if definition.container:
        owners = (d for d in symbols.definitions if d.name == definition.container and not d.container)
        shown += list(owners)[:1]
    return [_full(shown), _bare(shown)]


def _full(shown: Iterable[Definition]) -> dict[int, str]:
    return {d.line: d.text for d in shown}


def _bare(shown: Iterable[Definition]) -> dict[int, str]:
    return {d.line: d.signature for d in shown}


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
