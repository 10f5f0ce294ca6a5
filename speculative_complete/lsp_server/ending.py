"""Where a suggestion ends: the rest of the line, or a whole block body.

By default a suggestion is the rest of the current line. It spans several lines only where the
cursor opens an empty block body (``multiline: "auto"``): on the blank, indented line after a
header that ends in ``:`` (indentation languages) or ``{`` (brace languages) whose body is still
empty, or at the end of that header line itself. It then stops where the block ends (the first
line indented less than the body, or the brace that closes the block) or at ``maxLines``.

The decision needs only the lines around the cursor, so it is made on the event loop, before
decoding, and ``Ending.cut`` runs inside the engine (``GenerationConfig.stop_when``) to stop
decoding at the block's end instead of at the token limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from speculative_complete.lsp_server.brackets import C_LIKE, Lexis, closing_brace, lexis_for, without_comment
from speculative_complete.lsp_server.context import LanguageSpec

MultilineMode = Literal["auto", "never", "always"]
MULTILINE_MODES = ("auto", "never", "always")
SCAN_LINES = 50  # how far to look for the header above and the next code below


def indent_width(line: str) -> int:
    stripped = line.lstrip(" \t")
    return len(line[: len(line) - len(stripped)].expandtabs(4))


@dataclass(frozen=True)
class Ending:
    multiline: bool = False
    max_lines: int = 1
    style: Literal["indent", "braces"] = "indent"
    body_indent: int | None = None  # the block body's indentation width; None: from the first line
    header_indent: int = 0  # the header line's indentation width
    closer_present: bool = False  # braces: the document already closes this block below the cursor
    from_header: bool = False  # the cursor ends the header line: the suggestion starts with "\n"
    lexis: Lexis = C_LIKE  # braces: what hides a brace (strings, comments) in the document's language

    @property
    def stop_at_newline(self) -> bool:
        return not self.multiline

    def cut(self, text: str) -> int | None:
        """Where ``text`` (the suggestion so far) must end: at the block's end or the line cap."""
        if not self.multiline:
            newline = text.find("\n")
            return newline if newline >= 0 else None
        body = self.body_indent
        closer = closing_brace(text, self.lexis) if self.style == "braces" else None
        pos = 0
        for i, line in enumerate(text.split("\n")):
            start, pos = pos, pos + len(line) + 1
            body_line = i - int(self.from_header)  # -1: the rest of the header line
            if body_line >= self.max_lines:
                return max(start - 1, 0)
            if body_line >= 0 and line.strip():
                width = indent_width(line)
                if body is None:
                    if width <= self.header_indent:
                        return max(start - 1, 0)  # no body at all: the model went on after the block
                    body = width
                elif self.style == "indent" and i > 0 and width < body:
                    return start - 1  # dedent: the block ended on the line before
            if closer is not None and start <= closer < pos:
                end = closer - start
                if self.closer_present:  # the document has it: stop before it
                    return max(start - 1, 0) if not line[:end].strip() else start + end
                return start + end + 1
        return None


def _previous_code_line(text: str, line_start: int) -> str | None:
    end = line_start - 1  # the "\n" ending the previous line
    for _ in range(SCAN_LINES):
        if end < 0:
            return None
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end].rstrip("\r")
        if line.strip():
            return line
        end = start - 1
    return None


def next_code_line(text: str, offset: int) -> str:
    """The first non-blank line after the one ``offset`` is on (within ``SCAN_LINES`` lines),
    without its break; "" when there is none. Both the ending and the repeat check need it."""
    pos = text.find("\n", offset) + 1
    if pos == 0:
        return ""
    for _ in range(SCAN_LINES):
        end = text.find("\n", pos)
        line = text[pos:] if end < 0 else text[pos:end]
        if line.strip():
            return line.rstrip("\r")
        if end < 0:
            return ""
        pos = end + 1
    return ""


def _opens_block(line: str, spec: LanguageSpec) -> bool:
    code = without_comment(line, lexis_for(spec.name)).rstrip()  # "if x:  # note", "if (x) { // y"
    return code.endswith(":" if spec.blocks == "indent" else "{")


def decide(
    text: str,
    offset: int,
    before: str,
    after: str,
    spec: LanguageSpec,
    mode: str,
    max_lines: int,
    next_line: str,
) -> Ending:
    """Single line, or a multi-line body with how to find its end. ``next_line``: the first
    non-blank line below the cursor's (``next_code_line``), "" when there is none."""
    single = Ending()
    if mode == "never" or after.strip() or max_lines <= 1:
        return single
    line_start = offset - len(before)
    style = "indent" if spec.blocks == "indent" else "braces"
    lexis = lexis_for(spec.name)
    closer = style == "braces" and next_line.lstrip().startswith("}")

    if spec.module is None and mode != "always":
        return single  # plain text: no blocks to find
    if before.strip() and _opens_block(before, spec):  # the cursor ends the header line
        header = indent_width(before)
        if not next_line or indent_width(next_line) <= header:
            return Ending(True, max_lines, style, None, header, closer, from_header=True, lexis=lexis)
    elif not before.strip():  # the cursor is on a blank line, after its indentation
        header_line = _previous_code_line(text, line_start)
        if header_line is not None and _opens_block(header_line, spec):
            header = indent_width(header_line)
            body = indent_width(before)
            empty = not next_line or indent_width(next_line) <= header or closer
            if body > header and empty:
                return Ending(True, max_lines, style, body, header, closer, lexis=lexis)
    if mode == "always":  # any blank rest of line: the block around the cursor bounds it
        return Ending(
            True, max_lines, style, indent_width(before), closer_present=style == "braces", lexis=lexis
        )
    return single
