"""Which rows before the cursor fit in the prompt's token budget.

Priorities, in order:

1. the header rows of every node enclosing the cursor (the chain of class and function headers);
   if even they do not fit, the nearest of them;
2. the file's imports, in document order, up to ``IMPORT_SHARE`` of the budget;
3. units by distance from the cursor, nearest first, each kept whole or dropped whole. Only the
   nearest unit, when it is too big to keep whole, is opened up (and then its nearest part, and so
   on, until something is kept whole): its header rows stay and its own units join the queue; a
   unit with no structure left (a long literal) gives way line by line, never a line in half.
   So distant definitions are dropped whole before anything is cut in half.

Costs are real token counts of each unit's text from the model's tokenizer; the assembled prompt
is counted again by its caller, who asks for a smaller budget if the pieces merged differently.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from speculative_complete.lsp_server.context.outline import Outline, Unit, is_definition, split_lines

IMPORT_SHARE = 0.3
MAX_SKIPS = 48  # units tried and found too big before giving up (bounds the tokenizer calls)
MIN_LEFT = 4  # tokens: below this nothing useful fits any more


def rows_text(rows: Sequence[int] | set[int], lines: Sequence[str]) -> str:
    return "".join(lines[r] for r in sorted(rows))


def _add_imports(
    outline: Outline,
    lines: Sequence[str],
    count: Callable[[str], int],
    budget: int,
    rows: set[int],
    left: int,
) -> int:
    """Add whole import statements to ``rows``, within ``IMPORT_SHARE`` of the budget; the tokens
    left."""
    imports_left = int(budget * IMPORT_SHARE)
    for unit in outline.units:
        if unit.is_import:
            cost = count(rows_text(_unit_rows(unit, lines), lines))
            if cost <= min(left, imports_left):
                rows |= _unit_rows(unit, lines)
                left -= cost
                imports_left -= cost
    return left


def select_rows(outline: Outline, lines: Sequence[str], count: Callable[[str], int], budget: int) -> set[int]:
    """The rows (before ``outline.cursor_row``) to show, within ``budget`` tokens."""
    cursor_row = outline.cursor_row
    header = {r for r in outline.header if r < cursor_row}
    if count(rows_text(header, lines)) > budget:
        return nearest_rows(sorted(header), lines, count, budget)
    rows = set(header)
    left = _add_imports(outline, lines, count, budget, rows, budget - count(rows_text(rows, lines)))
    queue: list[tuple[int, int, Unit]] = []
    order = 0
    for unit in outline.units:
        if not unit.is_import:
            heapq.heappush(queue, (cursor_row - unit.last, order, unit))
            order += 1
    skips = 0
    stopped: set[int] = set()  # parents whose statements stop at the first one that did not fit
    frontier: set[int] | None = None  # units that may be opened up: the nearest, then its parts
    while queue and left >= MIN_LEFT and skips < MAX_SKIPS:
        _, _, unit = heapq.heappop(queue)
        unit_rows = _unit_rows(unit, lines) - rows
        if not unit_rows or unit.parent in stopped:
            continue
        if frontier is None:
            frontier = {id(unit)}
        cost = count(rows_text(unit_rows, lines))
        if cost <= left:
            rows |= unit_rows
            left -= cost
            frontier.clear()
            continue
        if id(unit) not in frontier:
            skips += 1
            if not is_definition(unit):
                stopped.add(unit.parent)  # a statement further up without this one would mislead
            continue
        # The nearest unit is too big: keep its header, queue its parts (nearest first).
        inner_header, inner = _open(unit, outline, lines)
        if not inner:
            skips += 1  # one line: never cut in half here
            continue
        header_cost = count(rows_text(inner_header - rows, lines)) if inner_header - rows else 0
        if header_cost > left:  # not even its header fits: line by line, nearest first
            inner_header, inner = split_lines(unit, lines)
            header_cost = 0
        rows |= inner_header
        left -= header_cost
        frontier = {id(part) for part in inner}
        for part in inner:
            heapq.heappush(queue, (cursor_row - part.last, -order, part))  # before equally far units
            order += 1
    return rows


def _open(unit: Unit, outline: Outline, lines: Sequence[str]) -> tuple[set[int], list[Unit]]:
    """A unit's header rows and smaller units: by syntax, looking through nodes that split into
    one part as big as the whole; else line by line. No parts: the unit is a single line."""
    node = unit.node
    for _ in range(32):
        if node is None or outline.split is None:
            break
        header, inner = outline.split(Unit(unit.first, unit.last, node))
        if len(inner) == 1 and not header and (inner[0].first, inner[0].last) == (unit.first, unit.last):
            node = inner[0].node
            continue
        if inner or header:
            return header, inner
        break
    if unit.first == unit.last:
        return set(), []
    return split_lines(unit, lines)


def _unit_rows(unit: Unit, lines: Sequence[str]) -> set[int]:
    return {r for r in range(unit.first, unit.last + 1) if lines[r].strip()}


def nearest_rows(
    candidates: Sequence[int], lines: Sequence[str], count: Callable[[str], int], budget: int
) -> set[int]:
    """The last resort: the rows nearest the cursor (the end of ``candidates``) that fit."""
    rows: set[int] = set()
    for r in reversed(candidates):
        if count(rows_text(rows | {r}, lines)) > budget:
            break
        rows.add(r)
    return rows


def render(rows: set[int], lines: Sequence[str], first: int, cursor_row: int) -> str:
    """The chosen rows in document order; a blank row is shown when the next non-blank row below
    it is (blank lines belong to what follows them)."""
    out: list[str] = []
    keep_blank = True  # the cursor row is always shown
    for r in range(cursor_row - 1, first - 1, -1):
        if lines[r].strip():
            keep_blank = r in rows
            if keep_blank:
                out.append(lines[r])
        elif keep_blank:
            out.append(lines[r])
    out.reverse()
    return "".join(out)
