"""Syntax trees for open documents: parsed with tree-sitter, re-parsed incrementally, windowed.

A full parse of a large file costs tens of milliseconds and a multi-megabyte one seconds, while an
incremental re-parse after a small edit costs a fraction of that (``benchmarks/README.md``,
"Measurements behind design choices", has the figures). So:

- Each document keeps its last tree and bytes; the next request diffs the new bytes against them
  (common prefix and suffix, compared in chunks at memcmp speed), tells the old tree about the
  edit and re-parses incrementally. That needs no hook in the LSP sync path, works the same for
  any number of edits between two requests, and costs a fraction of a millisecond for the diff.
- Documents over ``FULL_PARSE_CHARS`` are parsed only in a window around the cursor, with edges
  aligned to ``WINDOW_ALIGN`` so that consecutive keystrokes see the same window and the
  incremental path keeps working. A 10 MB file then costs what a 200 KB one does.

Used from one thread at a time (the decode worker); it holds at most ``MAX_DOCUMENTS`` trees.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from speculative_complete.lsp_server.context.languages import grammar

log = logging.getLogger(__name__)

FULL_PARSE_CHARS = 400_000
WINDOW_BEFORE = 160_000  # characters before the cursor that a windowed parse covers (at least)
WINDOW_AFTER = 40_000
WINDOW_ALIGN = 32_768
MAX_DOCUMENTS = 8
_CHUNK = 65_536


def to_bytes(text: str) -> bytes:
    """UTF-8 for tree-sitter; lone surrogates (possible in JSON strings) pass through as bytes."""
    return text.encode("utf-8", "surrogatepass")


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix: whole chunks first, then a binary search inside the first
    chunk that differs (slice comparisons run at memcmp speed; a byte loop would not)."""
    n = min(len(a), len(b))
    start = 0
    while start < n and a[start : start + _CHUNK] == b[start : start + _CHUNK]:
        start += _CHUNK
    if start >= n:
        return n
    lo, hi = start, min(start + _CHUNK, n)  # a[:lo] == b[:lo]; they differ before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """The common suffix of ``a`` and ``b``, at most ``limit`` bytes long."""
    n = min(len(a), len(b), limit)
    done = 0
    while done < n:
        step = min(_CHUNK, n - done)
        if a[len(a) - done - step : len(a) - done] != b[len(b) - done - step : len(b) - done]:
            break
        done += step
    lo, hi = done, min(done + _CHUNK, n)  # the last lo bytes agree; they differ within hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def point(data: bytes, offset: int) -> tuple[int, int]:
    """tree-sitter's (row, byte column) of ``offset`` in ``data``."""
    return data.count(b"\n", 0, offset), offset - (data.rfind(b"\n", 0, offset) + 1)


@dataclass(frozen=True)
class Window:
    """The part of a document that was parsed: ``text[start:end]``, starting at a line start."""

    start: int
    end: int
    first_row: int  # the document row where the window starts


def window_for(text: str, cursor: int) -> Window:
    if len(text) <= FULL_PARSE_CHARS:
        return Window(0, len(text), 0)
    start = max(0, (cursor - WINDOW_BEFORE) // WINDOW_ALIGN * WINDOW_ALIGN)
    end = min(len(text), -(-(cursor + WINDOW_AFTER) // WINDOW_ALIGN) * WINDOW_ALIGN)
    if start > 0:
        newline = text.find("\n", start, cursor)
        start = newline + 1 if newline >= 0 else start
    if end < len(text):
        newline = text.rfind("\n", cursor, end)
        end = newline + 1 if newline >= 0 else end
    return Window(start, end, text.count("\n", 0, start))


@dataclass
class Parsed:
    tree: Any  # tree_sitter.Tree
    source: bytes  # what was parsed: the window's bytes
    window: Window
    language: str
    incremental: bool  # whether this parse reused the previous tree


@dataclass
class _Entry:
    language: str
    window_start: int
    source: bytes
    tree: Any


class ParseCache:
    """The last tree of each recently used document."""

    def __init__(self, max_documents: int = MAX_DOCUMENTS) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._parsers: dict[str, Any] = {}
        self.max_documents = max_documents
        self.full_parses = 0
        self.incremental_parses = 0

    def _parser(self, language: str) -> Any | None:
        if language not in self._parsers:
            lang = grammar(language)
            if lang is None:
                return None
            import tree_sitter

            self._parsers[language] = tree_sitter.Parser(lang)
        return self._parsers[language]

    def forget(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def parse(self, uri: str, text: str, window: Window, language: str) -> Parsed | None:
        """The tree of ``text``, the document's ``window`` (``window_for``) as the caller wants it
        parsed; None when ``language`` has no grammar or parsing fails."""
        parser = self._parser(language)
        if parser is None:
            return None
        source = to_bytes(text)
        old = self._entries.get(uri)
        try:
            if old is not None and old.language == language and old.window_start == window.start:
                if old.source == source:
                    tree, incremental = old.tree, True
                else:
                    tree = self._reparse(parser, old, source)
                    incremental = True
                self.incremental_parses += 1
            else:
                tree, incremental = parser.parse(source), False
                self.full_parses += 1
        except Exception as exc:  # tree-sitter refusing input must never fail a completion
            log.warning("parsing %s failed: %s", uri, exc)
            self._entries.pop(uri, None)
            return None
        self._entries[uri] = _Entry(language, window.start, source, tree)
        self._entries.move_to_end(uri)
        while len(self._entries) > self.max_documents:
            self._entries.popitem(last=False)
        return Parsed(tree, source, window, language, incremental)

    @staticmethod
    def _reparse(parser: Any, old: _Entry, source: bytes) -> Any:
        before, after = old.source, source
        start = common_prefix(before, after)
        tail = common_suffix(before, after, min(len(before), len(after)) - start)
        old_end, new_end = len(before) - tail, len(after) - tail
        old.tree.edit(
            start_byte=start,
            old_end_byte=old_end,
            new_end_byte=new_end,
            start_point=point(before, start),
            old_end_point=point(before, old_end),
            new_end_point=point(after, new_end),
        )
        return parser.parse(after, old.tree)
