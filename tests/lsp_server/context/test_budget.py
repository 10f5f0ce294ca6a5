"""``speculative_complete.lsp_server.context.budget``: which rows before the cursor fit the prompt's
token budget.

Costs here are words (``str.split``): a real, deterministic count that makes every budget below
easy to check by hand. Outlines come from real tree-sitter parses or from plain text."""

from __future__ import annotations

from speculative_complete.lsp_server.context.budget import (
    IMPORT_SHARE,
    MAX_SKIPS,
    MIN_LEFT,
    nearest_rows,
    render,
    rows_text,
    select_rows,
)
from speculative_complete.lsp_server.context.outline import Outline, Unit, text_outline
from tests.support.outlines import PYTHON, syntax_outline


def words(text: str) -> int:
    return len(text.split())


def plain(*rows: str) -> tuple[Outline, list[str]]:
    """A plain-text outline of ``rows`` with the cursor on a last row of its own."""
    lines = [row + "\n" for row in rows] + ["cursor"]
    return text_outline(lines, len(rows)), lines


def select(outline: Outline, lines: list[str], budget: int) -> set[int]:
    return select_rows(outline, lines, words, budget)


# -- plain text: units kept whole, nearest first ---------------------------------------------------

PARAGRAPHS = ("a b c", "d e f", "", "g h", "", "i j k l", "m")  # costs 6, 2 and 5, far to near


def test_everything_fits():
    outline, lines = plain(*PARAGRAPHS)
    assert select(outline, lines, 100) == {0, 1, 3, 5, 6}


def test_a_unit_that_exactly_fills_the_budget_is_kept_and_one_over_is_dropped_whole():
    outline, lines = plain(*PARAGRAPHS)
    assert select(outline, lines, 13) == {0, 1, 3, 5, 6}  # 5 + 2 + 6: exactly full
    assert select(outline, lines, 12) == {3, 5, 6}  # the far paragraph misses by one: all of it goes


def test_nothing_more_is_tried_once_fewer_than_min_left_tokens_remain():
    outline, lines = plain(*PARAGRAPHS)
    assert MIN_LEFT == 4
    assert select(outline, lines, 5 + MIN_LEFT - 1) == {5, 6}  # 3 left: "g h" (2) is not tried
    assert select(outline, lines, 5 + MIN_LEFT) == {3, 5, 6}


def test_the_nearest_unit_too_big_gives_way_line_by_line_nearest_first():
    outline, lines = plain("a b", "", "c d e f g", "h", "i j")
    assert select(outline, lines, 5) == {4}


def test_a_statement_that_does_not_fit_drops_everything_of_its_parent_above_it():
    outline, lines = plain("a b", "", "c d e f g", "h", "i j")
    # "i j" and "h" fit (4 left); "c d e f g" does not, so "a b" above it is not shown alone
    assert select(outline, lines, 7) == {3, 4}


def test_a_single_line_is_never_cut_in_half():
    outline, lines = plain("a", "", "b c d e f g")
    assert select(outline, lines, 5) == {0}  # the long line goes whole; the farther one fits


def test_an_empty_document_selects_nothing():
    assert select(text_outline([""], 0), [""], 100) == set()
    outline, lines = plain(*PARAGRAPHS)
    assert select(outline, lines, 0) == set()


def test_max_skips_bounds_the_units_tried_after_the_first_too_big_one():
    def outline_with(big: int) -> tuple[Outline, list[str]]:
        lines = ["far\n"] + ["one two three four five six\n"] * big + ["near\n", "cursor"]
        units = [Unit(r, r, parent=r) for r in range(big + 2)]  # parents apart: no stopping
        return Outline(big + 2, units=units), lines

    outline, lines = outline_with(MAX_SKIPS - 1)
    assert select(outline, lines, 5) == {0, MAX_SKIPS}  # "near", then "far" after 47 misses
    outline, lines = outline_with(MAX_SKIPS)
    assert select(outline, lines, 5) == {MAX_SKIPS + 1}  # 48 misses: "far" is never tried


# -- headers ----------------------------------------------------------------------------------------


def test_headers_that_do_not_fit_keep_the_nearest_of_them():
    lines = ["a b\n", "c d\n", "e f\n", "cursor"]
    outline = Outline(3, header={0, 1, 2, 3})  # the cursor row is never selected
    assert select(outline, lines, 7) == {0, 1, 2}
    assert select(outline, lines, 5) == {1, 2}
    assert select(outline, lines, 3) == {2}
    assert select(outline, lines, 1) == set()


def test_nearest_rows_stops_at_the_first_row_that_does_not_fit():
    lines = ["a\n", "b c d e\n", "f\n", "g\n"]
    assert nearest_rows([0, 1, 2, 3], lines, words, 3) == {2, 3}  # "a" would fit but lies beyond
    assert nearest_rows([], lines, words, 3) == set()


# -- imports -----------------------------------------------------------------------------------------


def test_imports_come_in_document_order_within_their_share():
    lines = ["i1 x\n", "i2 x\n", "i3 x\n", "\n", "code\n", "cursor"]
    units = [Unit(0, 0, is_import=True), Unit(1, 1, is_import=True), Unit(2, 2, is_import=True), Unit(4, 4)]
    outline = Outline(5, units=units)
    assert IMPORT_SHARE == 0.3
    assert select(outline, lines, 20) == {0, 1, 2, 4}  # a share of 6: all three imports
    assert select(outline, lines, 19) == {0, 1, 4}  # a share of 5: the third does not fit


def test_a_smaller_import_after_one_too_big_still_fits():
    lines = ["a b c\n", "d e\n", "cursor"]
    outline = Outline(2, units=[Unit(0, 0, is_import=True), Unit(1, 1, is_import=True)])
    assert select(outline, lines, 9) == {1}  # a share of 2


# -- syntax outlines -------------------------------------------------------------------------------

# Words: headers "class Shape:" 2 + "def grow(self, k):" 3; "import os" 2, the try 10,
# "X = 1" 3, helper with its comment 9, the class's comment 5, docstring 2, area 4, total 3.


def test_headers_and_imports_first_then_units_nearest_first():
    outlined = syntax_outline("python", PYTHON)
    rows = select(outlined.outline, outlined.lines, 30)  # a share of 9: "import os", not the try
    assert rows == {0, 9, 10, 11, 14, 15, 16, 18, 19, 21, 22}


def test_a_definition_that_does_not_fit_lets_a_statement_above_it_in():
    outlined = syntax_outline("python", PYTHON)
    rows = select(outlined.outline, outlined.lines, 29)  # helper (9) misses by one; X = 1 fits
    assert rows == {0, 6, 14, 15, 16, 18, 19, 21, 22}


def test_a_statement_that_does_not_fit_stops_the_statements_above_it():
    source = "def f():\n    pass\na = 1\nb = [1, 2, 3, 4, 5, 6]\nc = 2\n|"
    outlined = syntax_outline("python", source)
    assert select(outlined.outline, outlined.lines, 8) == {4}
    source = "def f():\n    pass\na = 1\ndef g(x): return [1, 2, 3]\nc = 2\n|"
    outlined = syntax_outline("python", source)
    assert select(outlined.outline, outlined.lines, 8) == {2, 4}


BIG_CLASS = """import os

class Big:
    x = 1

    def one(self):
        return [1, 2, 3, 4, 5]

    def two(self):
        return 2
|"""


def test_the_nearest_unit_too_big_is_opened_keeping_its_header():
    outlined = syntax_outline("python", BIG_CLASS)
    rows = select(outlined.outline, outlined.lines, 12)
    assert rows == {0, 2, 3, 8, 9}  # "class Big:" stays; the big method goes whole


def test_a_header_that_does_not_fit_gives_way_line_by_line():
    source = "class Big(Base1, Base2, Base3, Base4):\n    a = 1\n    b = 2\n|"
    outlined = syntax_outline("python", source)
    assert select(outlined.outline, outlined.lines, 11) == {0, 1, 2}
    assert select(outlined.outline, outlined.lines, 9) == {0, 2}  # the header (5), then "b = 2"
    assert select(outlined.outline, outlined.lines, 4) == {2}  # not even the header: the nearest line


def test_what_is_selected_fits_the_budget():
    outlined = syntax_outline("python", PYTHON)
    for budget in range(0, 60):
        rows = select(outlined.outline, outlined.lines, budget)
        assert words(rows_text(rows, outlined.lines)) <= budget, budget


# -- render ---------------------------------------------------------------------------------------------


def test_render_shows_the_rows_in_order_with_the_blank_rows_above_shown_ones():
    outlined = syntax_outline("python", BIG_CLASS)
    text = render({0, 2, 3, 8, 9}, outlined.lines, 0, outlined.row)
    assert text == "import os\n\nclass Big:\n    x = 1\n\n    def two(self):\n        return 2\n"


def test_render_keeps_the_blank_rows_just_above_the_cursor_and_starts_at_first():
    lines = ["a\n", "b\n", "\n", "c\n", "\n", "\n", "cursor"]
    assert render({0, 1, 3}, lines, 0, 6) == "a\nb\n\nc\n\n\n"
    assert render({0, 1, 3}, lines, 1, 6) == "b\n\nc\n\n\n"
    assert render(set(), lines, 0, 6) == "\n\n"
    assert render({0}, lines, 0, 0) == ""


def test_rows_text_joins_rows_in_document_order():
    lines = ["a\n", "b\n", "c"]
    assert rows_text({2, 0}, lines) == "a\nc"
    assert rows_text([], lines) == ""
