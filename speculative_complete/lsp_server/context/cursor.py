"""What a prompt sees around the cursor: the window of the document it reads, that window's rows,
the cursor's row and line, and the outline of the rows above (``outline.py``)."""

from __future__ import annotations

from speculative_complete.lsp_server.context.languages import LanguageSpec, grammar
from speculative_complete.lsp_server.context.outline import Outline, SyntaxOutline, text_outline
from speculative_complete.lsp_server.context.syntax import ParseCache, Window, to_bytes, window_for
from speculative_complete.lsp_server.context.text import MAX_CHARS_PER_TOKEN, clean, split_rows


def cursor_outline(
    parses: ParseCache, uri: str, text: str, offset: int, spec: LanguageSpec, budget: int
) -> tuple[Window, Outline, list[str], int, str]:
    """The window around the cursor, its rows, the cursor's row and the text before the cursor
    on it, and the outline of the rows above (from the syntax tree when there is one).

    The tree is parsed with the cursor's line replaced by its indentation (plus ``pass`` in
    Python, so that an empty body stays a body): what the user is typing on that line, often
    unfinished and unbalanced, then cannot reshape the tree, and every keystroke on one line
    sees the same tree (and the parse cache returns it without parsing).
    """
    grammar_ok = spec.module is not None and grammar(spec.name) is not None
    if grammar_ok:
        window = window_for(text, offset)
    elif len(text) > budget * MAX_CHARS_PER_TOKEN * 4:
        start = max(0, offset - budget * MAX_CHARS_PER_TOKEN * 4)
        newline = text.find("\n", start, offset)
        start = newline + 1 if start > 0 and newline >= 0 else start
        window = Window(start, offset, text.count("\n", 0, start))
    else:
        window = Window(0, len(text), 0)
    local = clean(text[window.start : window.end])  # same length: a lone surrogate becomes "?"
    cursor = offset - window.start
    lines = split_rows(local)
    row = local.count("\n", 0, cursor)
    line_start = local.rfind("\n", 0, cursor) + 1
    cursor_text = local[line_start:cursor]
    if not grammar_ok:
        return window, text_outline(lines, row), lines, row, cursor_text
    line_end = local.find("\n", cursor)
    line_end = len(local) if line_end < 0 else line_end
    indent = cursor_text[: len(cursor_text) - len(cursor_text.lstrip(" \t"))]
    placeholder = indent + ("pass" if spec.name == "python" else "")
    parsed = parses.parse(
        uri or "untitled:", local[:line_start] + placeholder + local[line_end:], window, spec.name
    )
    if parsed is None:
        return window, text_outline(lines, row), lines, row, cursor_text
    col = len(to_bytes(indent))
    outline = SyntaxOutline(parsed.tree, lines, spec.name).outline(row, col)
    return window, outline, lines, row, cursor_text
