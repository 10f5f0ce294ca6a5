"""Turn decoded text into the item's insert text: where it ends, no duplicates, never blank.

Every item replaces the range from the cursor to the end of the cursor's line, so its text is what
the rest of the line (and, for a block body, the lines after it) should become. In order:

1. end it: one line, or a block body cut where the block ends (``ending.py``);
2. brackets: a closing bracket that closes nothing opened before it (in the suggestion or in the
   code before the cursor) ends the suggestion, so an auto-closed ``)`` is not closed twice;
3. no repeats: a suggestion that only rewrites the next line of the document is dropped, and a
   block body stops before a line that repeats the code following the cursor;
4. the text already after the cursor is merged, not duplicated: when the suggestion contains it in
   order (``"a, b)"`` over ``")"``, the usual auto-closed brackets and quotes) the item replaces it;
   otherwise it is kept after the suggestion minus any overlap (``"x)"`` + ``"):"`` gives ``"x):"``);
5. a multi-line body is indented the way the document is (tabs or spaces);
6. nothing empty, blank, or equal to what is already there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from speculative_complete.lsp_server import ending as endings
from speculative_complete.lsp_server.brackets import C_LIKE, Lexis, first_stray_closer, lexis_for, unclosed
from speculative_complete.lsp_server.context import LanguageSpec
from speculative_complete.lsp_server.ending import Ending

REPLACEMENT_CHAR = "\ufffd"  # what a token that splits a UTF-8 sequence decodes to
SCAN_CHARS = 4000  # how much code before the cursor is scanned for unclosed brackets
_WORDY = re.compile(r"\w")


@dataclass(frozen=True)
class Situation:
    """What post-processing knows about the cursor (taken on the event loop, before decoding)."""

    before: str = ""  # the cursor's line before the cursor
    after: str = ""  # the cursor's line after the cursor, without its line break
    next_line: str = ""  # the next non-blank line below the cursor's line ("" at the end)
    open_brackets: str = ""  # openers still unclosed before the cursor, innermost last
    ending: Ending = field(default_factory=Ending)
    indent_unit: str = ""  # the document's indentation step ("\t", "    "); "" unknown
    lexis: Lexis = C_LIKE  # what hides a bracket (strings, comments) in the document's language


def is_subsequence(needle: str, haystack: str) -> bool:
    chars = iter(haystack)
    return all(ch in chars for ch in needle)


def merge_with_suffix(suggestion: str, after: str) -> str:
    """The new rest of the line, given the suggestion and the text already after the cursor."""
    tail = after.rstrip()
    if not tail.strip() or is_subsequence(tail, suggestion):
        return suggestion
    overlap = next(
        (k for k in range(min(len(tail), len(suggestion)), 0, -1) if suggestion.endswith(tail[:k])), 0
    )
    return suggestion + tail[overlap:]


def balance(text: str, open_brackets: str, lexis: Lexis) -> str:
    """``text`` up to the first closing bracket that closes nothing (it would duplicate one the
    editor already has, or close a block the suggestion is not in)."""
    stray = first_stray_closer(text, open_brackets, lexis)
    return text if stray is None else text[:stray].rstrip()


def reindent(text: str, unit: str) -> str:
    """Leading whitespace of every line after the first in the document's style."""
    if not unit or "\n" not in text:
        return text
    lines = text.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        body = line.lstrip(" \t")
        lead = line[: len(line) - len(body)]
        if unit == "\t" and " " in lead:
            width = len(lead.expandtabs(4))
            lead = "\t" * (width // 4) + " " * (width % 4)
        elif unit != "\t" and "\t" in lead:
            lead = lead.expandtabs(len(unit))
        out.append(lead + body)
    return "\n".join(out)


def drop_repeats(text: str, situation: Situation) -> str | None:
    """Without what merely repeats the code below the cursor. None: the whole suggestion does."""
    following = situation.next_line.strip()
    if not following:
        return text
    if "\n" not in text:
        if not situation.after.strip() and (situation.before + text).strip() == following:
            return None  # the line being written is the next line again
        return text
    if not _WORDY.search(following):
        return text  # a lone "}" below is not something the body repeats
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if i > 0 and line.strip() == following:
            return "\n".join(lines[:i]).rstrip()
    return text


def finish(decoded: str, situation: Situation) -> str | None:
    """The insert text for the range cursor..end of line, or None when there is nothing to offer."""
    ending = situation.ending
    multiline = ending.multiline and not situation.after.strip()
    text = decoded.replace("\r\n", "\n")
    if multiline:  # the decode already ended where the block does (``GenerationConfig.stop_when``)
        text = "\n".join(line.rstrip() for line in text.split("\n")).rstrip()
        if ending.from_header and not text.startswith("\n"):
            return None  # a body must start on a new line
    else:
        text = text.split("\n", 1)[0].split("\r", 1)[0]
    text = text.rstrip().rstrip(REPLACEMENT_CHAR).rstrip()
    text = balance(text, situation.open_brackets, situation.lexis)
    if not text.strip():
        return None
    deduped = drop_repeats(text, situation)
    if deduped is None or not deduped.strip():
        return None
    text = reindent(deduped, situation.indent_unit) if multiline else deduped
    text = merge_with_suffix(text, situation.after)
    if not text.strip() or text == situation.after or text.rstrip() == situation.after.rstrip():
        return None
    return text


def indent_unit(text: str, offset: int, scan: int = 20_000) -> str:
    """The document's indentation step, from the lines before the cursor: a tab, or the most
    common positive difference between consecutive indentations (in spaces)."""
    chunk = text[max(0, offset - scan) : offset]
    tabs = spaces = 0
    steps: dict[int, int] = {}
    previous = 0
    for line in chunk.split("\n")[1:]:
        body = line.lstrip(" \t")
        if not body:
            continue
        lead = line[: len(line) - len(body)]
        if lead.startswith("\t"):
            tabs += 1
        elif lead.startswith(" "):
            spaces += 1
            width = len(lead)
            if width > previous:
                steps[width - previous] = steps.get(width - previous, 0) + 1
        previous = len(lead.expandtabs(4))
    if tabs > spaces:
        return "\t"
    if not steps:
        return ""
    return " " * max(steps, key=lambda k: (steps[k], -k))


def situation_for(
    text: str,
    offset: int,
    before: str,
    after: str,
    spec: LanguageSpec,
    multiline: str = "auto",
    max_lines: int = 12,
) -> Situation:
    """Everything post-processing needs, from the lines around the cursor only (cheap enough for
    the event loop, whatever the document's size)."""
    following = endings.next_code_line(text, offset)
    end = endings.decide(text, offset, before, after, spec, multiline, max_lines, following)
    lexis = lexis_for(spec.name)
    return Situation(
        before=before,
        after=after,
        next_line=following,
        open_brackets=unclosed(text[max(0, offset - SCAN_CHARS) : offset], lexis),
        ending=end,
        indent_unit=indent_unit(text, offset) if end.multiline else "",
        lexis=lexis,
    )
