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

from lsp_server.languages import LanguageSpec

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

    @property
    def stop_at_newline(self) -> bool:
        return not self.multiline

    def cut(self, text: str) -> int | None:
        """Where ``text`` (the suggestion so far) must end: at the block's end or the line cap."""
        if not self.multiline:
            newline = text.find("\n")
            return newline if newline >= 0 else None
        body = self.body_indent
        pos = depth = 0
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
            if self.style == "braces":
                end = _closing_brace(line, depth)
                if isinstance(end, int) and end >= 0:
                    if self.closer_present:  # the document has it: stop before it
                        return max(start - 1, 0) if not line[:end].strip() else start + end
                    return start + end + 1
                depth = -end - 1 if isinstance(end, int) else depth
        return None


def _closing_brace(line: str, depth: int) -> int:
    """The index of the brace in ``line`` that closes the block (depth would go below 0), or
    ``-(depth + 1)`` with the depth after the line. Quotes end at the line's end."""
    quote = ""
    for j, ch in enumerate(line):
        if quote:
            if ch == quote and line[j - 1] != "\\":
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return j
    return -(depth + 1)


def _line_at(text: str, start: int) -> tuple[str, int]:
    """The line starting at ``start`` (without its break) and where the next one starts."""
    end = text.find("\n", start)
    if end < 0:
        return text[start:], len(text) + 1
    return text[start:end], end + 1


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


def _next_code_line(text: str, next_start: int) -> str | None:
    pos = next_start
    for _ in range(SCAN_LINES):
        if pos > len(text):
            return None
        line, pos = _line_at(text, pos)
        if line.strip():
            return line.rstrip("\r")
    return None


def _opens_block(line: str, spec: LanguageSpec) -> bool:
    code = line.rstrip()
    if spec.blocks == "indent":
        if "#" in code:  # a trailing comment: "if x:  # note"
            code = code.split("#", 1)[0].rstrip() if code.count("#") == 1 else code
        return code.endswith(":")
    return code.endswith("{")


def decide(text: str, offset: int, before: str, after: str, spec: LanguageSpec, mode: str,
           max_lines: int) -> Ending:
    """Single line, or a multi-line body with how to find its end."""
    single = Ending()
    if mode == "never" or after.strip() or max_lines <= 1:
        return single
    line_start = offset - len(before)
    next_start = text.find("\n", offset)
    next_line = _next_code_line(text, next_start + 1) if next_start >= 0 else None
    style = "indent" if spec.blocks == "indent" else "braces"

    if spec.module is None and mode != "always":
        return single  # plain text: no blocks to find
    if before.strip() and _opens_block(before, spec):  # the cursor ends the header line
        header = indent_width(before)
        if next_line is None or indent_width(next_line) <= header:
            closer = style == "braces" and next_line is not None and next_line.lstrip().startswith("}")
            return Ending(True, max_lines, style, None, header, closer, from_header=True)
    elif not before.strip():  # the cursor is on a blank line, after its indentation
        header_line = _previous_code_line(text, line_start)
        if header_line is not None and _opens_block(header_line, spec):
            header = indent_width(header_line)
            body = indent_width(before)
            empty = next_line is None or indent_width(next_line) <= header or (
                style == "braces" and next_line.lstrip().startswith("}"))
            if body > header and empty:
                closer = style == "braces" and next_line is not None and next_line.lstrip().startswith("}")
                return Ending(True, max_lines, style, body, header, closer)
    if mode == "always":  # any blank rest of line: the block around the cursor bounds it
        return Ending(True, max_lines, style, indent_width(before), closer_present=style == "braces")
    return single
