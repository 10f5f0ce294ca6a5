"""Where a suggestion ends and what the editor gets, for documents as editors leave them:
auto-closed brackets and quotes after the cursor, the next line already written, tabs."""

from __future__ import annotations

import pytest

from speculative_complete.lsp_server.context.languages import SPECS
from speculative_complete.lsp_server.ending import decide, next_code_line
from speculative_complete.lsp_server.postprocess import indent_unit
from tests.support.completion_items import item_for


def at(source: str) -> tuple[str, int]:
    return source.replace("‸", ""), source.index("‸")


@pytest.mark.parametrize(
    ("source", "decoded", "item"),
    [
        ("print(‸)", '"hi")', '"hi")'),  # the auto-closed ")" is replaced, not doubled
        ("print(‸)", '"hi"', '"hi")'),  # the model stopped early: the ")" stays
        ("print(‸)", '"hi"))', '"hi")'),  # one closer too many: cut
        ('name = "‸"', 'Ada"', 'Ada"'),  # an auto-closed quote
        ("xs = [‸]", "1, 2, 3]", "1, 2, 3]"),
        ("if ok(‸):", "x)", "x):"),  # overlap with the rest of the line is not repeated
        ("total = sum(‸", "values)", "values)"),
        ("total = sum(‸", "values))", "values)"),
        ("call(a, ‸)  # note", "b)", "b)  # note"),
        ("x = ‸", "   ", None),  # blank: no item
        ("x = ‸", "", None),
        ("value = compute(‸)", ")", None),  # leaves the line as it is
        ("x = ‸   ", "value  ", "value"),  # trailing blanks of the line are replaced
        ("s = ‸", "caf\ufffd", "caf"),  # a broken trailing character is dropped
        ("s = ‸", "abc\r\ndef", "abc"),  # one line
    ],
)
def test_one_line_items_against_what_the_editor_has(source, decoded, item):
    text, offset = at(source)
    got, (line, start, end) = item_for(text, offset, decoded)
    assert got == item
    assert (line, start, end) == (0, offset, len(text))  # the range runs to the end of the line


def test_a_suggestion_that_rewrites_the_next_line_is_dropped():
    text, offset = at("a = 1\n‸\nb = 2\n")
    assert item_for(text, offset, "b = 2")[0] is None
    assert item_for(text, offset, "c = 3")[0] == "c = 3"
    text, offset = at("def f():\n    x = ‸\n    return x\n")
    assert item_for(text, offset, "1")[0] == "1"


@pytest.mark.parametrize(
    ("source", "uri", "decoded", "item"),
    [
        # Python: after `def f(x):` the body, stopping at the dedent.
        (
            "def f(x):\n    ‸\n\n\ndef g():\n    pass\n",
            "file:///a.py",
            "y = x * 2\n    return y\n\n\ndef h():\n    pass",
            "y = x * 2\n    return y",
        ),
        # ... from the end of the header line itself: the body starts on a new line.
        ("def f(x):‸\n", "file:///a.py", "\n    return x\n\nprint(1)\n", "\n    return x"),
        # C with the closing brace already there (auto-inserted): stop before it.
        (
            "int f(int x) {\n    ‸\n}\n",
            "file:///a.c",
            "if (x) {\n        return 1;\n    }\n    return 0;\n}\n\nint g(void)",
            "if (x) {\n        return 1;\n    }\n    return 0;",
        ),
        # JS without a closing brace yet: it is part of the suggestion.
        ("function f (x) {\n  ‸", "file:///a.js", "return x + 1\n}\n\nfunction g () {", "return x + 1\n}"),
        # Go: `if err != nil {` opens a block.
        (
            "func f() error {\n\tif err != nil {\n\t\t‸\n\t}\n\treturn nil\n}\n",
            "file:///a.go",
            "return err\n\t}\n\treturn nil\n}",
            "return err",
        ),
    ],
)
def test_multi_line_where_the_cursor_opens_an_empty_block(source, uri, decoded, item):
    text, offset = at(source)
    assert item_for(text, offset, decoded, uri)[0] == item


def test_the_line_cap_and_the_modes():
    text, offset = at("def f(x):\n    ‸\n")
    decoded = "a = 1\n    b = 2\n    c = 3\n    d = 4"
    assert item_for(text, offset, decoded, max_lines=2)[0] == "a = 1\n    b = 2"
    assert item_for(text, offset, decoded, multiline="never")[0] == "a = 1"
    text, offset = at("a = 1\n‸\nc = 3\n")  # not a block: one line, unless "always"
    assert item_for(text, offset, "b = 2\nc = 3\nd = 4")[0] == "b = 2"
    assert item_for(text, offset, "b = 2\nb2 = 3\nc = 3", multiline="always")[0] == "b = 2\nb2 = 3"


def test_a_body_is_indented_like_the_document():
    text, offset = at("def f(x):\n\tif x:\n\t\treturn 1\n\n\ndef g(y):\n\t‸\n")
    got = item_for(text, offset, "z = y\n    if z:\n        return z", "file:///t.py")[0]
    assert got == "z = y\n\tif z:\n\t\treturn z"
    assert indent_unit("def f():\n  a = 1\n  if a:\n    b = 2\n", 40) == "  "
    assert indent_unit("x\n\ty\n", 5) == "\t"


def test_a_block_body_never_starts_without_one():
    text, offset = at("def f(x):‸\n")
    assert item_for(text, offset, " # comment")[0] is None  # a body must start on a new line
    assert item_for(text, offset, "\n\n")[0] is None


@pytest.mark.parametrize(
    ("before", "after", "style", "multi"),
    [
        ("def f():\n    ", "", "python", True),
        ("if (x) {\n    ", "\n}", "javascript", True),
        ("if (x) {", "", "c", True),
        ("x = 1\n    ", "", "python", False),  # not after a header
        ("def f():\n    ", "\n    return 1\n", "python", False),  # the body is not empty
        ("if (x) {\n    ", "\n    y();\n}", "java", False),
        ("def f():\n    ", "", "text", False),  # plain text has no blocks
        ("class A:  # note\n    ", "", "python", True),
    ],
)
def test_when_a_block_body_is_offered(before, after, style, multi):
    spec = SPECS[style]
    text = before + after
    line = before.split("\n")[-1]
    ending = decide(
        text, len(before), line, after.split("\n")[0], spec, "auto", 12, next_code_line(text, len(before))
    )
    assert ending.multiline is multi


def test_the_next_code_line_skips_blank_lines_and_stops_at_the_end():
    text = "a = 1\n\n   \r\n  b = 2\r\nc"
    assert next_code_line(text, 2) == "  b = 2"
    assert next_code_line(text, len(text)) == "" and next_code_line("x", 0) == ""
    assert next_code_line("x\n" + "\n" * 60 + "y", 0) == ""  # beyond the lines it looks at
