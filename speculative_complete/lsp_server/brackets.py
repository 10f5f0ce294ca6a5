"""The one scanner for brackets in code: what is inside strings, character literals and comments
does not count.

Post-processing needs three answers about brackets: which ones the code before the cursor leaves
open, where a suggestion first closes something that is not open, and which brace closes the
block a multi-line body is in. All three walk the code with the same rules, here, so an escaped
backslash at the end of a string (``"C:\\\\"``) or a quote in a comment (``# don't``) means the
same thing to each of them.

The rules are lexical, per language, and deliberately small: line and block comments, one-line
strings with backslash escapes, strings that span lines (Python's triple quotes, JavaScript's
template literals, Go's raw strings), and character literals where ``'`` is also a lifetime or a
digit separator (Rust, C++), recognised only when the closing quote follows at once. Not handled:
JavaScript regex literals, Rust raw strings and nested block comments, the expressions inside
f-strings and template literals (their brackets are skipped with the string). A string left open
at the end of a line that cannot continue it ends there, as the compiler would report it, so one
unterminated quote never hides the rest of the text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}

# A character literal: one character or one escape sequence between single quotes.
_CHAR_LITERAL = re.compile(
    r"'(?:\\(?:x[0-9a-fA-F]{1,8}|u\{[0-9a-fA-F]{1,6}\}|u[0-9a-fA-F]{4}|[0-7]{1,3}|.)"
    r"|[^'\\\n])'"
)


@dataclass(frozen=True)
class Lexis:
    """What hides a bracket in one language."""

    line_comments: tuple[str, ...] = ("//",)
    block_comment: tuple[str, str] | None = ("/*", "*/")
    quotes: str = "\"'"  # open a string that ends at its quote or at the end of the line
    long_quotes: tuple[str, ...] = ()  # open a string that may span lines (checked first)
    raw_quotes: str = ""  # strings without escapes (Go's backquote)
    char_literals: bool = True  # "'" opens a literal only when a closing "'" follows at once


C_LIKE = Lexis()
LEXES: dict[str, Lexis] = {
    "python": Lexis(("#",), None, "\"'", ('"""', "'''"), "", False),
    "javascript": Lexis(quotes="\"'", long_quotes=("`",), char_literals=False),
    "go": Lexis(long_quotes=("`",), raw_quotes="`"),
    "rust": C_LIKE,
    "java": Lexis(long_quotes=('"""',)),
    "c": C_LIKE,
    "cpp": C_LIKE,
    "text": Lexis((), None, '"', (), "", False),  # prose: apostrophes are not quotes
}
LEXES["typescript"] = LEXES["tsx"] = LEXES["javascript"]


def lexis_for(language: str) -> Lexis:
    """The rules for a language name of ``languages.SPECS``; C's for any other."""
    return LEXES.get(language, C_LIKE)


def _string_end(text: str, start: int, quote: str, escapes: bool, multiline: bool) -> int:
    """The index just after the string whose body starts at ``start``."""
    j, n = start, len(text)
    while j < n:
        ch = text[j]
        if escapes and ch == "\\":
            j += 2
        elif text.startswith(quote, j):
            return j + len(quote)
        elif ch == "\n" and not multiline:
            return j  # unterminated: the newline is code again
        else:
            j += 1
    return n


def _skip(text: str, i: int, lexis: Lexis) -> int | None:
    """If a comment, string or character literal starts at ``i``, the index just after it."""
    for marker in lexis.line_comments:
        if text.startswith(marker, i):
            end = text.find("\n", i)
            return len(text) if end < 0 else end
    if lexis.block_comment and text.startswith(lexis.block_comment[0], i):
        opener, closer = lexis.block_comment
        end = text.find(closer, i + len(opener))
        return len(text) if end < 0 else end + len(closer)
    for quote in lexis.long_quotes:
        if text.startswith(quote, i):
            return _string_end(text, i + len(quote), quote, quote not in lexis.raw_quotes, True)
    ch = text[i]
    if ch not in lexis.quotes:
        return None
    if ch == "'" and lexis.char_literals:
        literal = _CHAR_LITERAL.match(text, i)
        return literal.end() if literal else None  # a lifetime or digit separator: plain code
    return _string_end(text, i + 1, ch, ch not in lexis.raw_quotes, False)


@functools.cache
def _landmarks(lexis: Lexis) -> re.Pattern[str]:
    """Where a bracket, comment or literal may start: the scanner jumps from one to the next
    (it runs on the event loop over a few thousand characters per request)."""
    starts = {*OPENERS, *CLOSERS, *lexis.quotes, *lexis.line_comments, *lexis.long_quotes}
    if lexis.block_comment:
        starts.add(lexis.block_comment[0])
    return re.compile("|".join(re.escape(s) for s in sorted(starts, key=len, reverse=True)))


def _scan(text: str, lexis: Lexis) -> Iterator[tuple[int, str]]:
    """``(index, what)`` for the code of ``text``: ``what`` is a bracket, or ``"comment"`` where a
    comment starts (the scan then goes on after it)."""
    find = _landmarks(lexis).search
    i = 0
    while (found := find(text, i)) is not None:
        j = found.start()
        ch = text[j]
        if ch in OPENERS or ch in CLOSERS:
            yield j, ch
            i = j + 1
            continue
        markers = (*lexis.line_comments, *(lexis.block_comment or ())[:1])
        if any(text.startswith(marker, j) for marker in markers):
            yield j, "comment"
        after = _skip(text, j, lexis)
        i = after if after is not None and after > j else j + 1


def code_brackets(text: str, lexis: Lexis) -> Iterator[tuple[int, str]]:
    """``(index, bracket)`` for every bracket of ``text`` outside comments and literals."""
    return ((i, ch) for i, ch in _scan(text, lexis) if ch != "comment")


def without_comment(line: str, lexis: Lexis) -> str:
    """``line`` up to its first comment outside literals (``if x == "#":  # note``)."""
    for i, what in _scan(line, lexis):
        if what == "comment":
            return line[:i]
    return line


def unclosed(code: str, lexis: Lexis) -> str:
    """Openers ``code`` leaves unclosed, innermost last. A closer that matches nothing is ignored
    (the code may start in the middle of an expression)."""
    stack: list[str] = []
    for _, ch in code_brackets(code, lexis):
        if ch in OPENERS:
            stack.append(ch)
        elif stack and stack[-1] == CLOSERS[ch]:
            stack.pop()
    return "".join(stack)


def first_stray_closer(text: str, open_brackets: str, lexis: Lexis) -> int | None:
    """The index of the first closer in ``text`` that closes nothing, given the openers still open
    before it (innermost last); None when there is none."""
    stack = list(open_brackets)
    for i, ch in code_brackets(text, lexis):
        if ch in OPENERS:
            stack.append(ch)
        elif stack and stack[-1] == CLOSERS[ch]:
            stack.pop()
        else:
            return i
    return None


def closing_brace(text: str, lexis: Lexis) -> int | None:
    """The index of the ``}`` in ``text`` that closes the block ``text`` starts inside of."""
    depth = 0
    for i, ch in code_brackets(text, lexis):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return i
    return None
