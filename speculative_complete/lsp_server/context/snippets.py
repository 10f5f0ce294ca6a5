"""Snippets from other open documents, picked by how much they resemble the code at the cursor.

The code a user is writing often mirrors code open in another tab (a caller and its callee, a
test and the code under test). Every other open document is cut into overlapping windows of
lines; each window's identifiers are compared with those of the lines just above the cursor
(Jaccard similarity), and the best few windows that clear a threshold are kept, one per region
of a file, never the same text twice, never text already in the prompt.

The query is the lines *above* the cursor's line, not the line itself, so the choice does not
change while the user types on one line and the prompt keeps its token prefix from keystroke to
keystroke. Windows are cached per document text, so an unchanged document costs a dictionary
lookup per request.

A model without a repository layout gets them as comments in the current file (``render``); one
with it (``fim.py``'s ``qwen-repo``) gets them as the other files' own text under their paths
(``file_body``).
"""

from __future__ import annotations

import posixpath
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from speculative_complete.lsp_server.context.languages import detect, uri_path

WINDOW_LINES = 12
WINDOW_STEP = 6
QUERY_LINES = 20
MIN_SCORE = 0.2
MAX_DOCUMENT_CHARS = 300_000  # larger documents: only their first part is searched
MAX_DOCUMENTS = 20
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
# Words every program has; they say nothing about which code is related.
_COMMON = frozenset(
    {
        "and",
        "args",
        "bool",
        "break",
        "case",
        "catch",
        "char",
        "class",
        "const",
        "continue",
        "def",
        "default",
        "del",
        "elif",
        "else",
        "enum",
        "except",
        "export",
        "extends",
        "false",
        "final",
        "finally",
        "float",
        "for",
        "from",
        "func",
        "function",
        "global",
        "if",
        "impl",
        "import",
        "in",
        "int",
        "interface",
        "is",
        "lambda",
        "let",
        "long",
        "match",
        "mod",
        "new",
        "none",
        "not",
        "null",
        "nil",
        "or",
        "package",
        "pass",
        "private",
        "protected",
        "pub",
        "public",
        "raise",
        "return",
        "self",
        "static",
        "str",
        "string",
        "struct",
        "super",
        "switch",
        "this",
        "throw",
        "throws",
        "true",
        "try",
        "type",
        "typeof",
        "use",
        "var",
        "void",
        "while",
        "with",
        "yield",
        "async",
        "await",
        "auto",
        "unsigned",
        "signed",
        "sizeof",
        "include",
        "define",
        "ifdef",
        "ifndef",
        "endif",
    }
)


@dataclass(frozen=True)
class OpenDocument:
    uri: str
    text: str
    language_id: str | None = None


ExcerptKind = Literal["similar", "definition", "edit"]


@dataclass(frozen=True)
class Snippet:
    """An excerpt of another file the prompt may show: a window that resembles the code at the
    cursor, the definitions of names used there (``definitions.py``), or a region just edited
    (``edits.py``)."""

    uri: str
    first_line: int  # 0-based, in that document
    text: str
    score: float
    kind: ExcerptKind = "similar"


def identifiers(text: str) -> frozenset[str]:
    return frozenset(w for w in _IDENT.findall(text) if w.lower() not in _COMMON)


class SnippetIndex:
    """Windows of the other open documents, cached per document text."""

    def __init__(self, max_cached: int = 32) -> None:
        self._cache: OrderedDict[tuple[str, int, int], tuple[list[str], list[tuple[int, frozenset[str]]]]] = (
            OrderedDict()
        )
        self.max_cached = max_cached

    def _windows(self, doc: OpenDocument) -> tuple[list[str], list[tuple[int, frozenset[str]]]]:
        # Keyed by the document's own string: its hash is computed once and kept by Python.
        key = (doc.uri, len(doc.text), hash(doc.text))
        cached = self._cache.get(key)
        if cached is None:
            lines = doc.text[:MAX_DOCUMENT_CHARS].split("\n")
            windows = []
            for start in range(0, max(len(lines) - WINDOW_LINES, 0) + 1, WINDOW_STEP):
                chunk = lines[start : start + WINDOW_LINES]
                if sum(1 for line in chunk if line.strip()) >= 3:
                    windows.append((start, identifiers("\n".join(chunk))))
            cached = self._cache[key] = (lines, windows)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return cached

    def forget(self, uri: str) -> None:
        """``uri`` was closed: its windows go now rather than when newer ones push them out."""
        for key in [key for key in self._cache if key[0] == uri]:
            del self._cache[key]

    def choose(
        self, query: str, documents: Sequence[OpenDocument], count: int, exclude: str = ""
    ) -> list[Snippet]:
        """Up to ``count`` snippets most similar to ``query``, best first; none whose text is in
        ``exclude`` (the prompt already shows it) or repeats an earlier pick."""
        wanted = identifiers(query)
        if count <= 0 or not wanted:
            return []
        scored: list[tuple[float, str, int, list[str]]] = []
        for doc in list(documents)[:MAX_DOCUMENTS]:
            lines, windows = self._windows(doc)
            for start, names in windows:
                if not names:
                    continue
                score = len(wanted & names) / len(wanted | names)
                if score >= MIN_SCORE:
                    scored.append((score, doc.uri, start, lines))
        scored.sort(key=lambda s: (-s[0], s[1], s[2]))
        chosen: list[Snippet] = []
        seen: set[str] = set()
        for score, uri, start, lines in scored:
            if len(chosen) >= count:
                break
            if any(c.uri == uri and abs(c.first_line - start) < WINDOW_LINES for c in chosen):
                continue
            text = "\n".join(lines[start : start + WINDOW_LINES]).strip("\n")
            key = "\n".join(line.strip() for line in text.splitlines() if line.strip())
            if key in seen or (exclude and _contained(text, exclude)):
                continue
            seen.add(key)
            chosen.append(Snippet(uri, start, text, round(score, 4)))
        return chosen


def _contained(text: str, haystack: str) -> bool:
    """Whether the snippet's lines already appear, in order, in the prompt (whitespace aside)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and "\n".join(lines) in "\n".join(
        line.strip() for line in haystack.splitlines() if line.strip()
    )


def display_path(uri: str) -> str:
    """A short name for a document in a snippet's header: its last two path components."""
    parts = [p for p in uri_path(uri).split("/") if p]
    return posixpath.join(*parts[-2:]) if parts else uri


def render(snippet: Snippet, comment: str, lines: int | None = None) -> str:
    """A snippet (its first ``lines`` lines) as comment lines, so the current file still reads as
    valid code."""
    kept = snippet.text.split("\n")[:lines]
    body = "".join(f"{comment} {line}".rstrip() + "\n" for line in kept)
    return f"{comment} Compare this snippet from {display_path(snippet.uri)}:\n{body}"


def file_body(parts: Sequence[tuple[Snippet, int]]) -> str:
    """What the repository layout shows of one other file: its snippets (each its first ``lines``
    lines) in file order, as the file has them (they are that file's text there, not comments in
    this one), with a comment line ``...`` between two, in that file's language, so that the
    model does not read them as one run of lines."""
    ordered = sorted(parts, key=lambda part: part[0].first_line)
    elision = "\n" + detect(None, ordered[0][0].uri).comment + " ...\n" if ordered else ""
    return elision.join("\n".join(s.text.split("\n")[:lines]) for s, lines in ordered)
