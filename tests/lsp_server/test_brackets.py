"""The one bracket scanner (``speculative_complete/lsp_server/brackets.py``) and the three answers
built on it: the openers left open before the cursor, the first stray closer in a suggestion, the
brace that ends a block body. Per language: strings, character literals, comments, escapes."""

from __future__ import annotations

import pytest

from speculative_complete.lsp_server.brackets import (
    closing_brace,
    first_stray_closer,
    lexis_for,
    unclosed,
    without_comment,
)
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.postprocess import balance
from tests.support.completion_items import item_for


@pytest.mark.parametrize(
    ("language", "code", "open_"),
    [
        # strings and escapes
        ("python", "f(a, [1, 2], {'k': '('}\n", "("),
        ("python", 'f("\\\\", (', "(("),  # an escaped backslash ends the string
        ("python", 'f("\\"(", ', "("),  # an escaped quote does not
        ("python", "f(r'\\'(', ", "("),  # nor in a raw string
        ("python", 'x = """\n(\n"""\ny = [', "["),  # a triple-quoted string spans lines
        ("python", "x = '(\ny = [", "["),  # an unterminated string ends at its line's end
        ("python", "s = f'{d[\"k\"]}' + g(", "("),
        # comments
        ("python", "x = ')'  # (", ""),
        ("python", "# don't (\ncall(", "("),  # an apostrophe in a comment is not a quote
        ("javascript", "f(a // (\n, b", "("),
        ("javascript", "f(/* ) */ a", "("),
        ("javascript", "f(/* (\n ) */ a, [", "(["),  # a block comment spans lines
        ("javascript", "f(`${x}\n)`, {", "({"),  # a template literal spans lines
        ("javascript", "f('it\\'s (', ", "("),
        ("python", "f(a // (", "(("),  # "//" is an operator in Python, not a comment
        ("c", 'printf("%s\\n", x); # (', "("),  # "#" is not a C comment (a preprocessor line, here junk)
        # character literals
        ("c", "if (c == '(') {", "{"),
        ("c", "if (c == '\\'') {", "{"),
        ("c", "if (c == '\\\\') { f(", "{("),
        ("java", "char c = '\\u0028'; f(", "("),
        ("rust", "fn f<'a>(x: &'a str) -> &'a str { let c = '{'; g(", "{("),  # lifetimes are not quotes
        ("rust", "let c = '\\''; v[", "["),
        ("cpp", "int n = 1'000'000; f(", "("),  # digit separators are not quotes
        ("go", "s := `raw \\` + f(", "("),  # Go's raw strings have no escapes
        ("go", "r := ')'; f(", "("),
        ("text", "don't (worry", "("),  # prose: apostrophes are not quotes
    ],
)
def test_unclosed_openers_per_language(language, code, open_):
    assert unclosed(code, lexis_for(language)) == open_


@pytest.mark.parametrize(
    ("language", "text", "open_", "kept"),
    [
        ("python", "x) + 1", "(", "x) + 1"),
        ("python", "x) + 1", "", "x"),
        ("python", '")"', "", '")"'),
        ("python", '"\\\\") + 1', "", '"\\\\"'),  # the string ends at the quote after the escaped backslash
        ("python", '"\\")" + x', "", '"\\")" + x'),  # an escaped quote: the ")" is inside the string
        ("python", "x  # done)", "", "x  # done)"),  # a ")" in a comment closes nothing
        ("c", "a, ')')", "(", "a, ')')"),
        ("c", "a); /* ) */ }", "(", "a); /* ) */"),
        ("rust", "x: &'a str) {", "", "x: &'a str"),
    ],
)
def test_the_first_stray_closer_ends_a_suggestion(language, text, open_, kept):
    assert balance(text, open_, lexis_for(language)) == kept


def test_the_stray_closer_index_and_none():
    c = lexis_for("c")
    assert first_stray_closer("f(x)]", "", c) == 4
    assert first_stray_closer("f(x)", "", c) is None
    assert first_stray_closer("x)", "[", c) == 1  # a mismatched closer closes nothing


@pytest.mark.parametrize(
    ("language", "text", "index"),
    [
        ("c", 'path = "C:\\\\"; }', 15),  # issue 15: an escaped backslash ended the string too late
        ("c", 'x = "}"; }', 9),
        ("c", "c = '}'; }", 9),
        ("c", "x = 1; // }\n}", 12),
        ("c", "/* } */ }", 8),
        ("c", "if (x) {\n  y();\n}\n}", 18),
        ("javascript", "s = `\n}\n`; }", 11),
        ("go", "s := `\\`; }", 10),
        ("python", "d = {'}': 1}", None),
    ],
)
def test_the_closing_brace_of_a_block(language, text, index):
    assert closing_brace(text, lexis_for(language)) == index
    if index is not None:
        assert text[index] == "}"


def test_without_comment_keeps_markers_inside_literals():
    assert without_comment('if x == "#":  # note', lexis_for("python")) == 'if x == "#":  '
    assert without_comment('if (s == "//") { // y', lexis_for("c")) == 'if (s == "//") { '
    assert without_comment("if (x) { /* y */", lexis_for("java")) == "if (x) { "


def test_a_string_ending_in_an_escaped_backslash_does_not_hide_the_block_end():
    ending = Ending(True, 12, "braces", 4, 0, closer_present=False, lexis=lexis_for("c"))
    body = 'path = "C:\\\\"; }\nint g(void) {'
    assert ending.cut(body) == body.index("}") + 1
    text = "void f(void) {\n    "
    assert item_for(text, len(text), body, "file:///a.c")[0] == 'path = "C:\\\\"; }'


def test_a_header_with_a_trailing_comment_still_opens_a_block():
    text = "int f(void) { // start\n    "
    assert item_for(text, len(text), "return 1;\n}\nint g;", "file:///a.c")[0] == "return 1;\n}"
    text = 'if x == "#":\n    '
    assert item_for(text, len(text), "y = 1\n    z = 2\nw = 3", "file:///a.py")[0] == "y = 1\n    z = 2"
