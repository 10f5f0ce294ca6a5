"""The rows a document's last prompt showed above the cursor, kept across keystrokes and lines
(``Shown``): while typing goes on below them and leaves them as they were, the next prompt shows
the same rows plus those typed since, so that its tokens are the cached prompt's but the last few.
"""

from __future__ import annotations

from dataclasses import dataclass

from speculative_complete.lsp_server.context.syntax import Window

RESERVE_STEP = 32  # tokens: the room kept for the cursor's line grows in these steps
STICKY_SLACK = 0.2  # of the rows' budget: left free when rows are chosen again while typing goes on
STICKY_ROWS = 8  # the most rows the cursor may move down and still keep the rows shown above it


@dataclass(frozen=True)
class Shown:
    """The rows a document's last prompt showed above its cursor (document rows), and their text
    then: the next prompt keeps them while they are unchanged and the cursor has moved at most
    ``STICKY_ROWS`` down."""

    rows: frozenset[int]
    text: str
    cursor_row: int
    # the snippet text (or the repository layout's text) the prompt began with: another one
    # changes the start anyway
    snippets: str
    # FIM with the cursor's line after the middle marker: the first row that goes there too, set
    # where the rows were chosen (the rows typed below them since follow the marker)
    middle_row: int = 0
    headroom: int = 0  # tokens the prompt could still grow by before its rows are chosen again
    renew_below: int = 0  # less headroom than this: worth choosing them again while idle


def kept_rows(
    shown: Shown | None, window: Window, lines: list[str], row: int, snippet_text: str
) -> set[int] | None:
    """The rows a prompt showed (``shown``: the document's last, or its pending renewal's) and
    the rows typed below them since (window rows), where that prompt's rows are unchanged
    and the cursor moved at most ``STICKY_ROWS`` down; else None."""
    if shown is None or shown.snippets != snippet_text:
        return None
    cursor_row = window.first_row + row
    if (
        not window.first_row
        <= shown.middle_row
        <= shown.cursor_row
        <= cursor_row
        <= shown.cursor_row + STICKY_ROWS
    ):
        return None
    kept = {r - window.first_row for r in shown.rows}
    if any(r < 0 for r in kept) or "".join(lines[r] for r in sorted(kept)) != shown.text:
        return None
    return kept | set(range(shown.cursor_row - window.first_row, row))


def remember(
    uri: str,
    window: Window,
    lines: list[str],
    rows_at: tuple[int, int],
    rows: set[int],
    snippets: str,
    room: tuple[int, int],
    shown: dict[str, Shown],
) -> None:
    """Keeps the rows shown in ``shown`` (``rows_at``: the cursor's row and the middle's first;
    ``room``: the prompt's headroom, and what choosing its rows again would free); none where
    they did not fit."""
    (row, middle_row), (headroom, slack) = rows_at, room
    if not uri or headroom < 0:
        shown.pop(uri, None)
        return
    above = sorted(r for r in rows if r < row)
    shown[uri] = Shown(
        rows=frozenset(window.first_row + r for r in above),
        text="".join(lines[r] for r in above),
        cursor_row=window.first_row + row,
        snippets=snippets,
        headroom=headroom,
        renew_below=min(slack, max(slack // 3, RESERVE_STEP)),
        middle_row=window.first_row + middle_row,
    )
