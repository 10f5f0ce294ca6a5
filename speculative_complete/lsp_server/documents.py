"""Documents as the client sees them: LSP line breaks, cursor positions in negotiated code units.

pygls keeps the open documents in sync (incremental edits, position codec) and we use it for
that, with one correction: its ``TextDocument.lines`` uses ``str.splitlines``, which also breaks
at form feed, vertical tab, \\x1c-\\x1e, NEL and U+2028/U+2029. LSP counts only ``\\n``, ``\\r\\n``
and ``\\r``, so a Python file with a form feed (common in old GNU code) or binary content would put
every later edit and cursor on the wrong line. ``LspTextDocument`` splits the LSP way (the
workspace is made to create them in ``protocol.py``, with pygls' other private members).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

_NON_LSP_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_LSP_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_EOL = ("\r\n", "\n", "\r")


def lsp_lines(text: str) -> list[str]:
    """``text`` split after each ``\\n``, ``\\r\\n`` or ``\\r`` (line ends kept), and nowhere else."""
    if not _NON_LSP_BREAKS.search(text):
        return text.splitlines(keepends=True)  # the fast path, identical when no other breaks occur
    return _LSP_LINE.findall(text)


def strip_eol(line: str) -> str:
    for eol in _EOL:
        if line.endswith(eol):
            return line[: -len(eol)]
    return line


class LspTextDocument(TextDocument):
    @property
    def lines(self) -> Sequence[str]:
        return tuple(lsp_lines(self.source))


def open_document(workspace: Workspace, uri: str) -> TextDocument | None:
    """The synced document for ``uri``, or None; never pygls' fallback of reading the file from disk."""
    return workspace.text_documents.get(unquote(uri))


class PositionError(ValueError):
    """A position that does not exist in the document; the message says why."""


@dataclass(frozen=True)
class Cursor:
    """Where a request points, in both code points (for slicing) and client units (for ranges)."""

    offset: int  # code points from the start of the document
    line: int
    character: int  # client units, clamped to the line's length
    end_character: int  # client units at the end of the line, before its line break
    before: str  # the line's text before the cursor
    after: str  # the line's text after the cursor, without its line break

    def start_position(self) -> types.Position:
        return types.Position(line=self.line, character=self.character)

    def line_end_position(self) -> types.Position:
        return types.Position(line=self.line, character=self.end_character)


def locate(document: TextDocument, position: types.Position) -> Cursor:
    """Resolve an LSP position: a character past the line's end means the end (as the spec says);
    a line past the document's end is an error."""
    lines = document.lines
    last_is_open = not lines or lines[-1].endswith(("\n", "\r"))  # an empty line follows the last break
    line_count = len(lines) + (1 if last_is_open else 0)
    if position.line >= line_count:
        raise PositionError(
            f"line {position.line} is beyond the end of the document ({line_count} lines, numbered from 0)"
        )
    text = strip_eol(lines[position.line]) if position.line < len(lines) else ""
    codec = document.position_codec
    end_character = codec.client_num_units(text)
    character = min(position.character, end_character)
    column = codec.position_from_client_units([text], types.Position(line=0, character=character)).character
    line_start = sum(len(line) for line in lines[: position.line])
    # A position inside a UTF-16 surrogate pair rounds up to the whole character; report that column.
    character = codec.client_num_units(text[:column])
    return Cursor(
        offset=line_start + column,
        line=position.line,
        character=character,
        end_character=end_character,
        before=text[:column],
        after=text[column:],
    )
