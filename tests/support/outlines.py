"""Source with a cursor marker, parsed and outlined the way ``ContextBuilder`` does it: the rows
split after each line end, the cursor's line parsed with a placeholder where the cursor is (Python
needs a statement there), the cursor column in bytes."""

from __future__ import annotations

from dataclasses import dataclass

import tree_sitter

from speculative_complete.lsp_server.context.languages import grammar
from speculative_complete.lsp_server.context.outline import Outline, SyntaxOutline
from speculative_complete.lsp_server.context.syntax import to_bytes
from speculative_complete.lsp_server.context.text import split_rows

CURSOR = "|"


@dataclass
class Outlined:
    outline: Outline
    lines: list[str]
    row: int  # the cursor's


def syntax_outline(language: str, source: str) -> Outlined:
    """``source`` holds ``CURSOR`` once, after nothing but the indentation of its line."""
    placeholder = "pass" if language == "python" else ""
    at = source.index(CURSOR)
    row = source.count("\n", 0, at)
    indent = source[source.rfind("\n", 0, at) + 1 : at]
    assert not indent.strip(), "the cursor must follow only indentation"
    tree = tree_sitter.Parser(grammar(language)).parse(to_bytes(source.replace(CURSOR, placeholder)))
    outliner = SyntaxOutline(tree, split_rows(source.replace(CURSOR, "")), language)
    return Outlined(outliner.outline(row, len(to_bytes(indent))), outliner.lines, row)


# A Python file with the cursor at ``|``: imports, a try around one, a commented function and a
# class whose last method is being written; the outline and budget tests count its words.
PYTHON = '''import os
try:
    import numpy as np
except ImportError:
    np = None

X = 1


# Adds one.
def helper(a):
    return a + 1


# The shape of things.
class Shape:
    """A shape."""

    def area(self):
        return 0

    def grow(self, k):
        total = k
        |
'''
