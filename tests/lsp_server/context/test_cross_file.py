"""Context from the rest of the project: definitions of the names near the cursor (``symbols.py``,
``definitions.py``), other documents' recent edits (``edits.py``), and where the prompt puts them,
with the real tokenizers (the default model's, and a Qwen2.5-Coder-shaped one with the repository
layout)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from speculative_complete.lsp_server.context import definitions
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.context.cross_file import DEFINITION_SHARE
from speculative_complete.lsp_server.context.edits import EditRing
from speculative_complete.lsp_server.context.snippets import OpenDocument
from speculative_complete.lsp_server.context.symbols import SymbolTable, extract
from speculative_complete.lsp_server.context.tokens import Tokens
from speculative_complete.lsp_server.workspace import WorkspaceIndex, WorkspaceLimits
from tests.support.lsp import tokenizer_source

LEDGER = '''"""Ledgers of the harbor."""
import math

RATE_LIMIT = 40


class Harbor:
    """A harbor of rows.

    More that the prompt does not need.
    """

    def __init__(self, rows):
        self.rows = rows

    def dock_count(self, limit=3):
        def inner():  # local: nobody outside can call it
            return 1

        return len(self.rows[:limit]) + inner()

    def _private(self):
        return 0


def settle_quorum_ember(ledger_limit, harbor_count, ember_ratio):
    """Settle the quorum of an ember."""
    return ledger_limit * harbor_count * ember_ratio
'''
CALLER = """import spindle_cobalt_0
from spindle_cobalt_0 import Harbor


def run(rows):
    harbor = Harbor(rows)
    total = harbor.dock_count()
    result = spindle_cobalt_0.settle"""
LEDGER_URI = "file:///w/spindle_cobalt_0.py"
CALLER_URI = "file:///w/main.py"


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))


@pytest.fixture(scope="module")
def repo_tokens() -> Tokens:
    """The default tokenizer with Qwen2.5-Coder's FIM and repository markers: the repository layout."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source()))
    markers = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": markers})
    return Tokens.from_tokenizer(tokenizer)


def test_python_definitions_keep_signatures_docstrings_and_members():
    symbols = extract(LEDGER_URI, LEDGER, "python")
    found = {(d.name, d.kind, d.container): d for d in symbols.definitions}
    assert set(found) == {
        ("RATE_LIMIT", "variable", ""),
        ("Harbor", "class", ""),
        ("__init__", "method", "Harbor"),
        ("dock_count", "method", "Harbor"),
        ("_private", "method", "Harbor"),
        ("settle_quorum_ember", "function", ""),
    }  # ``inner`` is local to a method: not there
    assert found[("Harbor", "class", "")].text == 'class Harbor:\n    """A harbor of rows."""'
    assert found[("dock_count", "method", "Harbor")].text == "    def dock_count(self, limit=3):"
    settle = found[("settle_quorum_ember", "function", "")]
    assert settle.text == (
        "def settle_quorum_ember(ledger_limit, harbor_count, ember_ratio):\n"
        '    """Settle the quorum of an ember."""'
    )
    assert settle.line == LEDGER.splitlines().index(settle.text.splitlines()[0])
    assert (
        symbols.module == "spindle_cobalt_0"
        and extract("file:///w/pkg/__init__.py", "", "python").module == "pkg"
    )


@pytest.mark.parametrize(
    ("language", "source", "names"),
    [
        (
            "javascript",
            "export const A = 1;\nclass Foo {\n  bar(x) { return x; }\n}\nfunction baz(a) {}\n",
            {"A", "Foo", "bar", "baz"},
        ),
        (
            "typescript",
            "interface Shape { area(): number }\ntype Id = string;\n"
            "function make(n: number): Id { return '' }\n",
            {"Shape", "Id", "make"},
        ),
        (
            "go",
            "package m\nfunc Add(a int) int { return a }\ntype T struct{ x int }\nfunc (t T) M() {}\n",
            {"Add", "T", "M"},
        ),
        (
            "rust",
            "pub fn add(a: i32) -> i32 { a }\nstruct P { x: i32 }\ntrait Q { fn q(&self); }\n",
            {"add", "P", "Q"},
        ),
        ("java", "class A {\n  int size(String s) { return 0; }\n}\ninterface B {}\n", {"A", "size", "B"}),
        (
            "c",
            "int add(int a, int b);\nstruct point { int x; };\nint add(int a, int b) { return a + b; }\n",
            {"add", "point"},
        ),
    ],
)
def test_other_languages_definitions_are_found(language, source, names):
    symbols = extract(f"file:///w/x.{language}", source, language)
    assert {d.name for d in symbols.definitions} == names
    assert all(d.text and "return a + b" not in d.text for d in symbols.definitions)  # no bodies


def test_the_issues_example_the_definition_reaches_the_prompt(tokens):
    """The module the cursor's line calls into is imported above: its functions are shown."""
    request = ContextRequest(
        CALLER, len(CALLER), 512, uri=CALLER_URI, others=(OpenDocument(LEDGER_URI, LEDGER, "python"),)
    )
    prompt = ContextBuilder().build(replace(request, neighbor_snippets=0), tokens)
    assert "# def settle_quorum_ember(ledger_limit, harbor_count, ember_ratio):" in prompt.text
    assert "#     def dock_count(self, limit=3):" in prompt.text  # the class used above, with its methods
    assert "_private" not in prompt.text and "inner" not in prompt.text and "return" not in prompt.text
    assert [s.kind for s in prompt.snippets] == ["definition"]
    off = ContextBuilder().build(replace(request, neighbor_snippets=0, cross_file=False), tokens)
    assert "settle_quorum_ember" not in off.text and not off.snippets


def test_definitions_come_from_the_workspace_table_and_the_open_documents_text_wins(tokens):
    on_disk = LEDGER.replace("ember_ratio)", "ember_ratio, stale)")
    table = SymbolTable.of([extract(LEDGER_URI, on_disk, "python")])
    request = ContextRequest(CALLER, len(CALLER), 512, uri=CALLER_URI, symbols=table, neighbor_snippets=0)
    from_disk = ContextBuilder().build(request, tokens)
    assert "ember_ratio, stale):" in from_disk.text  # not open: the workspace's table
    fresh = ContextBuilder().build(
        replace(request, others=(OpenDocument(LEDGER_URI, LEDGER, "python"),)), tokens
    )
    assert "ember_ratio):" in fresh.text and "stale" not in fresh.text  # open: its text as it is now


def test_names_nearest_first_specific_only_never_the_current_file():
    files = [
        extract("file:///w/a/far.py", "def shared_name(x):\n    pass\n", "python"),
        extract("file:///w/b/near/here_lib.py", "def shared_name(y):\n    pass\n", "python"),
        extract("file:///w/b/near/main.py", "def local_one():\n    pass\n", "python"),
        *(extract(f"file:///w/c{i}.py", "def run(z):\n    pass\n", "python") for i in range(4)),
    ]
    project = definitions.Project(SymbolTable.of(files))
    lines = ["x = 1\n", "shared_name(1)\n", "run(2)\n", "local_one()\n", ""]
    names = definitions.names_near(lines, 4)
    assert names[:3] == ["local_one", "run", "shared_name"]  # nearest line first
    chosen = definitions.choose(project, "file:///w/b/near/main.py", names, len, 10_000)
    assert [(s.uri, s.text) for s in chosen] == [("file:///w/b/near/here_lib.py", "def shared_name(y):")]
    # ``run`` is defined in four files: it says nothing about which one is meant; ``local_one``
    # is the current file's own.


def test_definitions_stay_within_their_share_and_the_whole_prompt_within_the_budget(tokens):
    many = "".join(
        f"def helper_{i}(first_argument_{i}, second_argument_{i}):\n    pass\n\n" for i in range(40)
    )
    calls = "".join(f"    helper_{i}(a, b)\n" for i in range(40))
    text = "import helpers\n\n\ndef main(a, b):\n" + calls + "    "
    others = (OpenDocument("file:///w/helpers.py", many, "python"),)
    for budget in (64, 256, 512, 2048):
        prompt = ContextBuilder().build(
            ContextRequest(text, len(text), budget, uri=CALLER_URI, others=others, neighbor_snippets=0),
            tokens,
        )
        excerpt = "".join(line + "\n" for line in prompt.text.split("\n") if line.startswith("#"))
        assert len(prompt.ids) <= budget and tokens.count(excerpt) <= int(budget * DEFINITION_SHARE)
        assert "    helper_39(a, b)" in prompt.text
    assert "# def helper_39(first_argument_39" in prompt.text  # nearest first


def test_typing_on_one_line_keeps_the_prompts_start(tokens):
    """The names come from the lines above the cursor's: typing on it changes only the end."""
    others = (OpenDocument(LEDGER_URI, LEDGER, "python"),)
    builder, previous = ContextBuilder(), None
    line_start = CALLER.rindex("\n") + 1
    for end in range(line_start + 4, len(CALLER) + 1):
        request = ContextRequest(CALLER[:end], end, 512, uri=CALLER_URI, others=others, heal=False)
        prompt = builder.build(request, tokens)
        assert any(s.kind == "definition" for s in prompt.snippets)
        if previous is not None:
            shared = next(
                (i for i, (a, b) in enumerate(zip(previous.ids, prompt.ids, strict=False)) if a != b), None
            )
            assert shared is None or shared >= len(previous.ids) - 4
        previous = prompt


def test_in_the_repository_layout_definitions_go_under_their_files_path(repo_tokens):
    request = ContextRequest(
        CALLER,
        len(CALLER),
        1024,
        uri=CALLER_URI,
        others=(OpenDocument(LEDGER_URI, LEDGER, "python"),),
        neighbor_snippets=0,
        workspace_folders=("file:///w",),
    )
    prompt = ContextBuilder().build(request, repo_tokens)
    assert prompt.fim == "qwen-repo"
    text = repo_tokens.decode(list(prompt.ids))
    assert text.startswith("<|repo_name|>w\n<|file_sep|>spindle_cobalt_0.py\n")
    assert "\ndef settle_quorum_ember(ledger_limit, harbor_count, ember_ratio):\n" in text  # its own text
    assert "<|file_sep|>main.py\n" in text


def test_the_edit_ring_keeps_the_latest_region_per_place_and_other_documents_only():
    ring = EditRing(max_chunks=3)
    text = "".join(f"line_{i} = compute_{i}()\n" for i in range(100))
    ring.edited("file:///w/a.py", text, 10)
    ring.edited("file:///w/a.py", text.replace("line_11 ", "renamed_11 "), 11)  # the same place: replaced
    ring.edited("file:///w/b.py", text, 50)
    assert [(s.uri, s.first_line, s.kind) for s in ring.others("file:///w/c.py")] == [
        ("file:///w/b.py", 46, "edit"),
        ("file:///w/a.py", 7, "edit"),
    ]
    assert "renamed_11" in ring.others("file:///w/c.py")[1].text
    assert [s.uri for s in ring.others("file:///w/a.py")] == ["file:///w/b.py"]  # never its own
    for row in (80, 30):  # the oldest goes when the ring is full
        ring.edited("file:///w/d.py", text, row)
    assert [s.first_line for s in ring.others("file:///w/c.py")] == [26, 76, 46]
    ring.edited("file:///w/e.py", text, 26 + 4)  # the same text elsewhere evicts its older copy
    assert [(s.uri, s.first_line) for s in ring.others("file:///w/c.py")][:2] == [
        ("file:///w/e.py", 26),
        ("file:///w/d.py", 76),
    ]
    ring.edited("file:///w/f.py", "short\n", 40)  # beyond its end: the lines that are there
    ring.forget("file:///w/e.py")
    assert "file:///w/e.py" not in {s.uri for s in ring.others("file:///w/c.py")}


def test_recent_edits_are_shown_unless_the_prompt_holds_them_already(tokens):
    edited = (
        "def price_with_tax(amount, rate):\n    gross = amount * (1 + rate)\n    return round(gross, 2)\n"
    )
    ring = EditRing()
    ring.edited("file:///w/pricing.py", edited, 1)
    text = "def checkout(cart):\n    total = sum(cart)\n    "
    request = ContextRequest(text, len(text), 512, uri=CALLER_URI, recent_edits=ring.others(CALLER_URI))
    prompt = ContextBuilder().build(request, tokens)
    assert "# Compare this snippet from w/pricing.py:\n# def price_with_tax(amount, rate):" in prompt.text
    assert [s.kind for s in prompt.snippets] == ["edit"]
    held = edited + "\n\n" + text
    again = ContextBuilder().build(replace(request, text=held, offset=len(held)), tokens)
    assert not again.snippets  # its lines are the prompt's own already


def test_the_workspace_index_keeps_the_symbol_table_current(tmp_path: Path):
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "ledger.py").write_text(LEDGER)
    (root / "pkg" / "notes.py").write_text("NOTE = 1\n")
    index = WorkspaceIndex()
    index.scan([root], WorkspaceLimits())
    table, version = index.symbols, index.symbols_version
    assert [f.uri for f, _ in table.definitions("settle_quorum_ember")] == [
        (root / "pkg" / "ledger.py").as_uri()
    ]
    assert index.snapshot()["definitions"] == len(table) == 7
    (root / "pkg" / "notes.py").write_text("def fresh_function(a):\n    pass\n")
    (root / "pkg" / "ledger.py").unlink()
    index.changed([root / "pkg" / "notes.py", root / "pkg" / "ledger.py"])
    assert index.symbols_version > version
    assert not index.symbols.definitions("settle_quorum_ember") and index.symbols.definitions(
        "fresh_function"
    )
    assert table.definitions("settle_quorum_ember")  # the old table, as a reader had it, is unchanged


def test_a_documents_choice_holds_until_a_new_name_with_a_definition_comes_near(tokens):
    """Moving down a line without a new name keeps the prompt's start (the KV cache's prefix),
    though the window of lines above slides; a line that calls another function changes it."""
    others = (OpenDocument(LEDGER_URI, LEDGER, "python"),)
    body = "".join(f"    step_{i} = rows[{i}]\n" for i in range(19))  # Harbor: the 20th line up
    start = "def run(rows):\n    harbor = Harbor(rows)\n" + body
    builder = ContextBuilder()

    def excerpts(text: str) -> tuple:
        prompt = builder.build(ContextRequest(text, len(text), 512, uri=CALLER_URI, others=others), tokens)
        return tuple(s.text for s in prompt.snippets)

    first = excerpts(start + "    ")
    assert "class Harbor:" in first[0] and "settle_quorum_ember" not in first[0]
    # ``Harbor(rows)`` is now more than 20 lines above: chosen afresh, it would have to go
    assert excerpts(start + "    more = 1\n    ") == first
    called = excerpts(start + "    value = settle_quorum_ember(1, 2, 3)\n    ")
    assert called != first and "def settle_quorum_ember(" in called[0]
    moved = start + "    more = 1\n    "
    fresh = ContextBuilder().build(
        ContextRequest(moved, len(moved), 512, uri=CALLER_URI, others=others), tokens
    )
    assert all("class Harbor" not in s.text for s in fresh.snippets)  # what a fresh choice would be


def test_names_imported_over_several_lines_are_asked_about():
    lines = [
        "from .exceptions import (\n",
        "    ConnectionError,\n",
        "    SSLError as TlsError,\n",
        ")\n",
        "import pathlib\n",
        "x = 1\n",
        "",
    ]
    assert definitions.imported_names(lines) == [
        "exceptions",
        "ConnectionError",
        "SSLError",
        "TlsError",
        "pathlib",
    ]
    far = [*lines[:-1], *(["filler_value = 1\n"] * 25), ""]  # the imports beyond the near lines
    near = definitions.names_near(far, len(far) - 1)
    assert near == ["filler_value", "exceptions", "ConnectionError", "SSLError", "TlsError", "pathlib"]


def test_a_class_too_large_for_the_share_comes_with_its_constructor_alone():
    members = "".join(f"    def method_number_{i}(self, argument_{i}):\n        pass\n\n" for i in range(12))
    source = f"class Ledger:\n    def __init__(self, rows, limit):\n        pass\n\n{members}"
    project = definitions.Project(SymbolTable.of([extract("file:///w/ledger.py", source, "python")]))
    whole = definitions.choose(project, CALLER_URI, ["Ledger"], len, 10_000)
    assert whole[0].text.count("def ") == definitions.MAX_MEMBERS  # the first of its methods
    (small,) = definitions.choose(project, CALLER_URI, ["Ledger"], definitions.estimate, 60)
    assert small.text == "class Ledger:\n    def __init__(self, rows, limit):"


def test_every_names_signature_comes_before_any_names_docstrings_and_methods():
    """Breadth first: a class with its methods and docstrings would fill a small share alone; each
    name near the cursor gets its bare signature first, and what is left goes to the fuller forms,
    nearest name first."""
    members = "".join(f'    def method_{i}(self, value_{i}):\n        """Doc {i}."""\n\n' for i in range(8))
    ledger = f'class Ledger:\n    """Rows."""\n\n    def __init__(self, rows):\n        pass\n\n{members}'
    helpers = (
        'def tally(rows, limit):\n    """Count the rows up to a limit."""\n\n\ndef audit(rows):\n    pass\n'
    )
    project = definitions.Project(
        SymbolTable.of(
            [
                extract("file:///w/ledger.py", ledger, "python"),
                extract("file:///w/helpers.py", helpers, "python"),
            ]
        )
    )
    names = ["Ledger", "tally", "audit"]
    bare = definitions.choose(project, CALLER_URI, names, definitions.estimate, 70)
    assert [s.text for s in bare] == [
        "class Ledger:\n    def __init__(self, rows):",
        "def tally(rows, limit):\ndef audit(rows):",
    ]
    roomy = definitions.choose(project, CALLER_URI, names, definitions.estimate, 10_000)
    assert roomy[0].text.count("def method_") == 8 and '"""Rows."""' in roomy[0].text
    assert (
        roomy[1].text == 'def tally(rows, limit):\n    """Count the rows up to a limit."""\ndef audit(rows):'
    )
    middle = definitions.choose(project, CALLER_URI, names, definitions.estimate, 76)
    assert '"""Rows."""' in middle[0].text and "method_" not in middle[0].text  # the nearest grows first
    assert middle[1].text == "def tally(rows, limit):\ndef audit(rows):"


def test_a_bare_signature_is_one_line_without_its_docstring():
    source = (
        "class Port:\n    def send(\n        self,\n        method: str,\n        params=None,\n"
        '    ) -> int:\n        """Send it."""\n'
    )
    (owner, send) = extract("file:///w/port.py", source, "python").definitions
    assert send.text.endswith('"""Send it."""')
    assert send.signature == "    def send(self, method: str, params=None) -> int:"
    assert owner.signature == owner.text == "class Port:"
    commented = extract("file:///w/c.py", "def f(\n    a,  # the first\n    b,\n):\n    pass\n", "python")
    assert commented.definitions[0].signature == commented.definitions[0].text  # a comment ends a line
