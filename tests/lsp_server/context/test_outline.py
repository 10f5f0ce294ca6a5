"""``speculative_complete.lsp_server.context.outline``: the text before the cursor as header rows
and units, from real tree-sitter trees of Python, JavaScript, Go, Rust and C, and from plain
text."""

from __future__ import annotations

import tree_sitter

from speculative_complete.lsp_server.context.languages import grammar
from speculative_complete.lsp_server.context.outline import (
    MAX_IMPORT_WRAPPER_ROWS,
    Unit,
    is_definition,
    merge_units,
    node_rows,
    split_lines,
    text_outline,
)
from speculative_complete.lsp_server.context.syntax import to_bytes
from tests.support.outlines import PYTHON, syntax_outline


def spans(units: list[Unit]) -> list[tuple[int, int]]:
    return [(unit.first, unit.last) for unit in units]


def kinds(units: list[Unit]) -> list[str | None]:
    return [unit.node.type if unit.node is not None else None for unit in units]


# -- syntax outlines -----------------------------------------------------------------------------


def test_python_keeps_the_chain_of_headers_and_makes_the_rest_units():
    outlined = syntax_outline("python", PYTHON)
    lines, outline = outlined.lines, outlined.outline
    assert outline.cursor_row == outlined.row == 23
    assert [lines[r].strip() for r in sorted(outline.header)] == ["class Shape:", "def grow(self, k):"]
    assert spans(outline.units) == [(0, 0), (1, 4), (6, 6), (9, 11), (14, 14), (16, 16), (18, 19), (22, 22)]
    assert kinds(outline.units) == [
        "import_statement",
        "try_statement",
        "expression_statement",
        "function_definition",
        "comment",  # the class's comment: the class is on the cursor's path, not a unit
        "expression_statement",  # the docstring
        "function_definition",
        "expression_statement",
    ]


def test_units_of_one_parent_share_it_and_others_do_not():
    outline = syntax_outline("python", PYTHON).outline
    parents = [unit.parent for unit in outline.units]
    module, comment, docstring, area, total = parents[0], parents[4], parents[5], parents[6], parents[7]
    assert parents[:5] == [module] * 5
    assert docstring == area != module
    assert total not in (module, area)
    assert comment == module


def test_imports_and_a_small_try_around_one_are_imports():
    outline = syntax_outline("python", PYTHON).outline
    assert [unit.is_import for unit in outline.units] == [True, True] + [False] * 6


def test_a_comment_directly_above_a_definition_goes_with_it():
    outline = syntax_outline("python", PYTHON).outline
    helper = next(
        unit for unit in outline.units if unit.node is not None and unit.node.type == "function_definition"
    )
    assert (helper.first, helper.last) == (9, 11)  # "# Adds one." is row 9


def test_an_import_wrapper_counts_only_while_small():
    def wrapped(fillers: int) -> bool:
        body = "    x = 1\n" * fillers
        source = f"try:\n{body}    import os\nexcept ImportError:\n    pass\n|"
        (unit,) = syntax_outline("python", source).outline.units
        assert unit.node.type == "try_statement"
        return unit.is_import

    largest = MAX_IMPORT_WRAPPER_ROWS - 3  # try + import + except + pass around the fillers
    assert wrapped(largest) is True
    assert wrapped(largest + 1) is False


def test_at_module_level_nothing_is_a_header():
    source = "import os\n\n\ndef f():\n    return 1\n\n|"
    outline = syntax_outline("python", source).outline
    assert outline.header == set()
    assert spans(outline.units) == [(0, 0), (3, 4)]


def test_an_empty_document_has_no_rows():
    for source in ("|", "\n\n|"):
        outline = syntax_outline("python", source).outline
        assert (outline.header, outline.units) == (set(), [])


def test_split_opens_a_unit_into_its_header_and_body():
    source = PYTHON.split("    def grow")[0] + "|"  # the cursor after the class, at module level
    outlined = syntax_outline("python", source)
    shape = outlined.outline.units[-1]  # with its comment
    assert (shape.first, shape.last, shape.node.type) == (14, 19, "class_definition")
    assert outlined.outline.split is not None
    header, (body,) = outlined.outline.split(shape)
    assert header == {15}
    assert (body.first, body.last, body.node.type, body.parent) == (16, 19, "block", shape.node.id)
    inner_header, members = outlined.outline.split(body)
    assert inner_header == set()
    assert spans(members) == [(16, 16), (18, 19)]


def test_multibyte_text_keeps_its_rows_and_a_second_statement_on_a_row_is_not_a_unit():
    source = 's = "ééé"; t = 1\ncafé = 2\ndef f():\n    """Ünïcode: 日本."""\n    |'
    outlined = syntax_outline("python", source)
    assert outlined.outline.header == {2}
    assert spans(outlined.outline.units) == [(0, 0), (1, 1), (3, 3)]


def test_javascript_headers_and_units():
    source = (
        'import { a } from "./a";\n'
        "const b = 2;\n"
        "\n"
        "function outer(x) {\n"
        "  const y = x + 1;\n"
        "  if (y > 2) {\n"
        "    return y;\n"
        "  }\n"
        "  |\n"
        "}\n"
    )
    outline = syntax_outline("javascript", source).outline
    assert outline.header == {3}
    assert spans(outline.units) == [(0, 0), (1, 1), (4, 4), (5, 7)]
    assert kinds(outline.units) == [
        "import_statement",
        "lexical_declaration",
        "lexical_declaration",
        "if_statement",
    ]
    assert [unit.is_import for unit in outline.units] == [True, False, False, False]


def test_go_looks_through_a_block_into_its_statements():
    source = (
        "package main\n\n"
        'import "fmt"\n\n'
        "type Point struct {\n\tX int\n\tY int\n}\n\n"
        "func main() {\n\tp := Point{1, 2}\n\tfmt.Println(p)\n\t|\n}\n"
    )
    outline = syntax_outline("go", source).outline
    assert outline.header == {9}
    assert spans(outline.units) == [(0, 0), (2, 2), (4, 7), (10, 10), (11, 11)]
    assert kinds(outline.units)[2:] == ["type_declaration", "short_var_declaration", "expression_statement"]


def test_rust_nested_headers_and_a_doc_comment_joined_to_its_function():
    source = (
        "use std::io;\n\n"
        "// Adds.\n"
        "fn add(a: i32) -> i32 {\n    a + 1\n}\n\n"
        "impl Foo {\n    fn bar(&self) {\n        let x = 1;\n        |\n    }\n}\n"
    )
    outline = syntax_outline("rust", source).outline
    assert outline.header == {7, 8}
    assert spans(outline.units) == [(0, 0), (2, 5), (9, 9)]
    assert kinds(outline.units) == ["use_declaration", "function_item", "let_declaration"]


def test_c_keeps_a_storage_class_on_the_header_row_in_the_header():
    source = "#include <stdio.h>\n\nstatic int twice(int x) {\n    int y = x * 2;\n    |\n}\n"
    outline = syntax_outline("c", source).outline
    assert outline.header == {2}  # ``static`` starts its line but belongs to the header
    assert spans(outline.units) == [(0, 0), (3, 3)]
    assert [unit.is_import for unit in outline.units] == [True, False]


def test_broken_code_still_outlines_the_rows_before_it():
    source = "const a = 1;\nfunction broken(x {\n  let y = [1, 2;\n  |\n"
    outline = syntax_outline("javascript", source).outline
    assert spans(outline.units) == [(0, 0), (1, 2)]
    assert outline.header == set()


def test_the_cursor_row_is_never_a_header_row():
    source = "def f():\n    x = 1\n    |"
    outlined = syntax_outline("python", source)
    assert outlined.row not in outlined.outline.header and outlined.outline.header == {0}


# -- node_rows ---------------------------------------------------------------------------------------


def test_node_rows_ends_a_node_that_stops_at_column_0_on_the_row_before():
    tree = tree_sitter.Parser(grammar("python")).parse(to_bytes("x = 1\ny = 2\n"))
    assert tree.root_node.end_point == (2, 0)
    assert node_rows(tree.root_node) == (0, 1)
    statement = tree.root_node.named_children[1]
    assert node_rows(statement) == (1, 1)


def test_node_rows_of_an_empty_node_is_its_row():
    tree = tree_sitter.Parser(grammar("python")).parse(b"")
    assert node_rows(tree.root_node) == (0, 0)


# -- merge_units -------------------------------------------------------------------------------------


def test_merge_units_sorts_and_merges_overlapping_units():
    merged = merge_units(
        [Unit(5, 6, is_import=True), Unit(0, 2, is_import=True), Unit(2, 3, is_import=False)], []
    )
    assert merged == [Unit(0, 3, None, False, 0), Unit(5, 6, None, True, 0)]


def test_merge_units_keeps_imports_merged_with_imports_as_imports():
    assert merge_units([Unit(0, 1, is_import=True), Unit(1, 1, is_import=True)], []) == [
        Unit(0, 1, None, True)
    ]


def test_merge_units_joins_a_comment_only_when_directly_above():
    tree = tree_sitter.Parser(grammar("python")).parse(b"# a\nx = 1\n# b\n\ny = 2\n")
    comment_a, x, comment_b, y = tree.root_node.named_children
    units = [Unit(0, 0, comment_a), Unit(1, 1, x), Unit(2, 2, comment_b), Unit(4, 4, y)]
    merged = merge_units(units, [])
    assert spans(merged) == [(0, 1), (2, 2), (4, 4)]
    assert merged[0].node is x  # the joined unit is the statement, so it can still be split


# -- is_definition ------------------------------------------------------------------------------------


def test_definitions_and_statements():
    outline = syntax_outline("python", PYTHON).outline
    assert [is_definition(unit) for unit in outline.units] == [
        False,  # import
        False,  # try
        False,  # X = 1
        True,  # def helper
        False,  # a comment
        False,  # the docstring
        True,  # def area
        False,  # total = k
    ]
    assert is_definition(Unit(0, 3)) is False  # plain text lines


# -- plain text ----------------------------------------------------------------------------------------


def test_text_outline_makes_paragraphs_units_and_nothing_a_header():
    lines = ["first\n", "para\n", "\n", "  \n", "second\n", "\n", "third\n", "cursor"]
    outline = text_outline(lines, 7)
    assert outline.header == set() and outline.split is None
    assert spans(outline.units) == [(0, 1), (4, 4), (6, 6)]


def test_text_outline_ends_a_paragraph_at_the_cursor_row():
    lines = ["a\n", "b\n", "c\n", "d\n"]
    assert spans(text_outline(lines, 2).units) == [(0, 1)]
    assert text_outline(lines, 0).units == []


def test_split_lines_gives_each_non_blank_line_alone():
    lines = ["a\n", "\n", "b\n", "   \n", "c\n"]
    assert split_lines(Unit(0, 4), lines) == (set(), [Unit(0, 0), Unit(2, 2), Unit(4, 4)])
    assert split_lines(Unit(1, 1), lines) == (set(), [])
