"""The text before the cursor as syntax units: what must stay, and what may be dropped whole.

The prompt is built from whole lines (rows). Walking from the root of the tree down to the node at
the cursor, each node on that path splits the rows before its child on the path into

- units: named children that are statements or members of a block (a function, a class, an
  import, an ``if`` statement...), each starting on a line of its own. A unit is kept or dropped
  whole; the nearest one can be opened up (``split``) into its header and its own units;
- header rows: every other non-blank row, which is how the chain of enclosing headers
  (``class A:``, ``def f(self):``, ``if (x) {``) stays in the prompt.

Blank rows belong to the unit below them. Documents without a grammar get the same shape from
their text: paragraphs (runs of non-blank lines) are units, their lines sub-units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from speculative_complete.lsp_server.context.languages import BLOCK_TYPES, import_query
from speculative_complete.lsp_server.context.syntax import to_bytes

MAX_IMPORT_WRAPPER_ROWS = 12


@dataclass
class Unit:
    """Rows ``first..last`` (inclusive) of the window, kept or dropped together."""

    first: int
    last: int
    node: Any | None = None  # its syntax node, to split it further; None: plain-text lines
    is_import: bool = False
    parent: int = 0  # which node it is a part of: units of one parent are dropped in order


@dataclass
class Outline:
    cursor_row: int
    header: set[int] = field(default_factory=set)  # rows always kept
    units: list[Unit] = field(default_factory=list)
    # Opens a unit up into its header rows and its own units; None: only line by line.
    split: Callable[[Unit], tuple[set[int], list[Unit]]] | None = None


def node_rows(node: Any) -> tuple[int, int]:
    """First and last row a node has text on (a node ending at column 0 ends on the row before)."""
    first = node.start_point.row
    end_row, end_col = node.end_point
    return first, (end_row - 1 if end_col == 0 and end_row > first else end_row)


class SyntaxOutline:
    """Splits nodes of one parsed window into header rows and units."""

    def __init__(self, tree: Any, lines: Sequence[str], language: str) -> None:
        self.tree, self.lines, self.language = tree, lines, language
        self._imports: set[int] | None = None
        self._last_import_row = -1
        self._line_bytes: dict[int, bytes] = {}

    def imports(self) -> set[int]:
        if self._imports is None:
            self._imports = set()
            query = import_query(self.language)
            if query is not None:
                import tree_sitter

                found = tree_sitter.QueryCursor(query).captures(self.tree.root_node).get("import", [])
                self._imports = {node.id for node in found}
                self._last_import_row = max((node.start_point.row for node in found), default=-1)
        return self._imports

    def _holds_import(self, node: Any, extra_rows: int) -> bool:
        """An import, or a small statement wrapped around some (``try: import x``)."""
        imports = self.imports()
        if node.id in imports:
            return True
        if extra_rows > MAX_IMPORT_WRAPPER_ROWS or node.start_point.row > self._last_import_row:
            return False
        stack = [node]
        while stack:
            current = stack.pop()
            if current.id in imports:
                return True
            stack.extend(current.named_children)
        return False

    def _starts_line(self, node: Any) -> bool:
        row, col = node.start_point
        if row >= len(self.lines):
            return False
        data = self._line_bytes.get(row)
        if data is None:
            data = self._line_bytes[row] = to_bytes(self.lines[row])
        return not data[:col].strip()

    def split(self, node: Any, limit: int) -> tuple[set[int], list[Unit]]:
        """Header rows and units of ``node`` among its rows before ``limit``."""
        first, last = node_rows(node)
        last = min(last, limit - 1)
        units: list[Unit] = []

        as_block = node.type in BLOCK_TYPES or node.type == "ERROR"

        def visit(parent: Any) -> None:
            children = parent.named_children
            for child in children:
                c_first, c_last = node_rows(child)
                if c_first >= limit:
                    break
                if c_last >= limit:
                    continue
                is_block = child.type in BLOCK_TYPES or child.type == "ERROR"
                same = child.start_byte == parent.start_byte and child.end_byte == parent.end_byte
                if same or (is_block and len(children) == 1):
                    visit(child)  # the same text, or Go's block > statement_list: look through
                elif self._starts_line(child) and (as_block or c_first > first):
                    # (a child on a header's first row is part of the header: ``static`` in C)
                    units.append(
                        Unit(c_first, c_last, child, self._holds_import(child, c_last - c_first), node.id)
                    )
                elif is_block:
                    visit(child)  # a body opened on its header's line (``{``): look inside

        visit(node)
        units = merge_units(units, self.lines)
        covered = {r for u in units for r in range(u.first, u.last + 1)}
        header = {r for r in range(first, last + 1) if r not in covered and self.lines[r].strip()}
        return header, units

    def outline(self, cursor_row: int, cursor_col: int) -> Outline:
        """The header rows of every node on the path to the cursor, and their units."""
        root = self.tree.root_node
        leaf = root.named_descendant_for_point_range((cursor_row, cursor_col), (cursor_row, cursor_col))
        path = []
        node = leaf
        while node is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        out = Outline(cursor_row, split=lambda unit: self.split(unit.node, unit.last + 1))
        for i, node in enumerate(path):
            limit = path[i + 1].start_point.row if i + 1 < len(path) else cursor_row
            limit = min(limit, cursor_row)
            header, units = self.split(node, limit)
            out.header |= header
            out.units.extend(units)
        out.header.discard(cursor_row)
        return out


def merge_units(units: list[Unit], lines: Sequence[str]) -> list[Unit]:
    """Units sorted, overlapping ones merged (two statements on one row), and a comment directly
    above a unit joined to it (a doc comment goes with what it documents)."""
    units = sorted(units, key=lambda u: (u.first, u.last))
    out: list[Unit] = []
    for unit in units:
        if out and unit.first <= out[-1].last:
            prev = out[-1]
            out[-1] = Unit(
                prev.first, max(prev.last, unit.last), None, prev.is_import and unit.is_import, prev.parent
            )
            continue
        prev_is_comment = out and out[-1].node is not None and "comment" in out[-1].node.type
        if prev_is_comment and out[-1].last + 1 == unit.first:
            prev = out.pop()
            unit = Unit(prev.first, unit.last, unit.node, unit.is_import, unit.parent)
        out.append(unit)
    return out


_DEFINITION_WORDS = (
    "function",
    "method",
    "class",
    "impl",
    "interface",
    "struct",
    "enum",
    "trait",
    "mod_item",
    "namespace",
    "decorated_definition",
    "type_declaration",
    "constructor",
    "module",
    "union",
    "template_declaration",
)


def is_definition(unit: Unit) -> bool:
    """Whether a unit defines something (a function, a class...) rather than being a statement:
    dropping a definition does not make the code after it read oddly, dropping a statement can."""
    kind = unit.node.type if unit.node is not None else ""
    return any(word in kind for word in _DEFINITION_WORDS)


def text_outline(lines: Sequence[str], cursor_row: int) -> Outline:
    """Plain text: paragraphs before the cursor row are units; nothing is a header."""
    out = Outline(cursor_row)
    start = None
    for row in range(cursor_row):
        blank = not lines[row].strip()
        if not blank and start is None:
            start = row
        if blank and start is not None:
            out.units.append(Unit(start, row - 1))
            start = None
    if start is not None:
        out.units.append(Unit(start, cursor_row - 1))
    return out


def split_lines(unit: Unit, lines: Sequence[str]) -> tuple[set[int], list[Unit]]:
    """A unit without structure: each non-blank line on its own (the last resort)."""
    return set(), [Unit(r, r) for r in range(unit.first, unit.last + 1) if lines[r].strip()]
