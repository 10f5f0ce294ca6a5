"""The prompt: golden cases per language, the budget, FIM, snippets, parsing, bad input.

These use the real SmolLM2 tokenizer (no model weights), so token counts are the real ones.
"""

from __future__ import annotations

import collections
import itertools
import random
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from speculative_complete.decoding.kv_cache import common_prefix_length
from speculative_complete.lsp_server.context import fim
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.context.languages import detect, grammar
from speculative_complete.lsp_server.context.snippets import OpenDocument, SnippetIndex
from speculative_complete.lsp_server.context.syntax import FULL_PARSE_CHARS, ParseCache, Window, window_for
from speculative_complete.lsp_server.context.text import split_rows
from speculative_complete.lsp_server.context.tokens import Tokens
from tests.support.completion_items import item_for
from tests.support.golden_cases import CASES, Golden
from tests.support.lsp import tokenizer_source

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tokenizer_source()))


@pytest.fixture(scope="module")
def tokens(tokenizer):
    return Tokens.from_tokenizer(tokenizer)


def at_marker(source: str) -> tuple[str, int]:
    return source.replace("‸", ""), source.index("‸")


# -- golden cases -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.uri.rsplit("/", 1)[-1])
def test_golden_prompt_and_item(case: Golden, tokens):
    text, offset = at_marker(case.source)
    prompt = ContextBuilder().build(ContextRequest(text, offset, case.budget, uri=case.uri), tokens)
    assert prompt.text + "⟨" + prompt.healed + "⟩" == case.prompt
    assert len(prompt.ids) <= case.budget
    assert prompt.language == detect(None, case.uri).name != "text"
    item, where = item_for(text, offset, case.decoded, case.uri)
    assert item == case.item
    assert where == case.range


def test_the_enclosing_headers_stay_and_distant_definitions_go_whole(tokens):
    text, offset = at_marker(CASES[0].source)
    prompt = ContextBuilder().build(ContextRequest(text, offset, 120, uri="file:///w/cache.py"), tokens)
    assert "class Cache:" in prompt.text and "def put(self, key, value):" in prompt.text
    assert "def load(path):" not in prompt.text and "json.load(f)" not in prompt.text  # dropped whole
    assert "def get(self, key):" not in prompt.text and "move_to_end(key)\n        return" not in prompt.text
    roomy = ContextBuilder().build(ContextRequest(text, offset, 2000, uri="file:///w/cache.py"), tokens)
    assert roomy.text + roomy.healed == text[:offset]  # a budget that fits everything keeps everything


# -- the budget ---------------------------------------------------------------------------------------


def stdlib_sample(count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    files = sorted(p for p in (STDLIB / "json").glob("*.py")) + [STDLIB / "argparse.py", STDLIB / "typing.py"]
    out = []
    for _ in range(count):
        text = rng.choice(files).read_text()
        out.append((text, rng.randrange(len(text) + 1)))
    return out


@pytest.mark.parametrize("budget", [16, 48, 200, 512])
def test_never_over_budget_never_a_cut_token(tokens, budget):
    builder = ContextBuilder()
    for text, offset in stdlib_sample(25, budget) + [("", 0), ("x", 0), ("x", 1), ("def f():\n", 9)]:
        prompt = builder.build(ContextRequest(text, offset, budget, uri="file:///lib.py"), tokens)
        ids = list(prompt.ids)
        assert len(ids) <= budget
        assert tokens.decode(ids) == prompt.text  # the ids are exactly the prompt's text
        line = text[text.rfind("\n", 0, offset) + 1 : offset]
        if tokens.count(line) < budget // 2:
            assert (prompt.text + prompt.healed).endswith(line)  # it ends at the cursor
        whole = tokens.encode(prompt.text + prompt.healed)
        assert whole[: len(ids)] == ids  # healing removed whole tokens from the end, nothing else


def test_keystrokes_on_one_line_keep_the_prompt_prefix(tokens):
    text = (STDLIB / "json" / "encoder.py").read_text()
    start = text.index("            if isinstance(value, str):")
    line = text[start : text.index("\n", start)]
    builder = ContextBuilder()
    previous = None
    for k in range(len("            "), len(line) + 1):
        document = text[:start] + line[:k] + text[start + len(line) :]
        request = ContextRequest(document, start + k, 512, uri="file:///encoder.py")
        ids = list(builder.build(request, tokens).ids)
        if previous is not None:
            shared = next(
                (i for i, (a, b) in enumerate(zip(previous, ids, strict=False)) if a != b),
                min(len(previous), len(ids)),
            )
            assert shared >= len(previous) - 12  # only the cursor's line (and the healed token) moves
        previous = ids
    assert builder.parses.full_parses == 1  # the cursor line is blanked for parsing: one tree for all


GET_VALUES = "    def _get_values(self, action, arg_strings):\n"


def get_values_body() -> tuple[str, int, str]:
    """argparse.py, where ``_get_values``'s body starts (after its first indentation), and the
    body's first ~1200 characters and on to the blank line after: what the typing tests type back."""
    text = (STDLIB / "argparse.py").read_text()
    start = text.index(GET_VALUES) + len(GET_VALUES)
    start += len(text[start:]) - len(text[start:].lstrip(" "))
    return text, start, text[start : text.index("\n\n", start + 1200)]


def typed_prompts(
    tokens,
    text: str,
    start: int,
    typed: str,
    *,
    keep_rows: bool = True,
    renew: bool = False,
    adopt: bool = True,
) -> list:
    """``typed`` typed back at ``start`` of ``text`` (Enter brings the next line's indentation, as
    an editor's auto-indent does): (document, offset, prompt) after each keystroke. ``renew``: at
    each line's end (a pause) the server's idle work runs, choosing the rows again where the
    builder says so (``needs_renewal``); its prompt follows that keystroke's, its offset None.
    ``adopt``: its prefill ends within the pause, and the document adopts the rows (else a key
    pre-empts it every time)."""
    builder = ContextBuilder()
    head, tail = text[:start], text[start + len(typed) :]
    out, i = [], 0
    while i < len(typed):
        j = i + 1
        while typed[i] == "\n" and j < len(typed) and typed[j] == " ":
            j += 1
        i = j
        document = head + typed[:i] + tail
        if not keep_rows:
            builder.shown.clear()  # every prompt's rows chosen afresh
        request = ContextRequest(document, start + i, 512, uri="file:///argparse.py")
        out.append((document, start + i, builder.build(request, tokens)))
        if renew and typed[i : i + 1] == "\n" and builder.needs_renewal(request.uri):
            out.append((document, None, builder.build(replace(request, renew_rows=True), tokens)))
            if adopt:
                assert builder.adopt_renewal(request.uri)
                assert not builder.needs_renewal(request.uri)  # room for the lines to come
            else:
                assert builder.needs_renewal(request.uri)  # the old rows are still the shown ones
    return out


def prefills(prompts: list, at_keystrokes: bool = False) -> int:
    """How many prompts changed the one before them before its last line (a prefill of all after
    it); ``at_keystrokes``: only keystrokes' prompts, not idle work's (``typed_prompts``)."""
    count = 0
    for (_, _, before), (_, offset, after) in itertools.pairwise(prompts):
        shared = common_prefix_length(before.ids, after.ids)
        count += shared < len(before.ids) - 16 and not (at_keystrokes and offset is None)
    return count


def test_typing_down_a_function_keeps_the_rows_shown_above(tokens):
    """Rows chosen afresh for each new line drop a distant unit for the line just typed, and the
    prompt then differs from near its start: a prefill of the whole prompt at a line's start.
    Kept, they change only where typing outgrew the budget. Every prompt still shows only the
    document's own rows, in order, with the enclosing header, within the budget."""
    text, start, typed = get_values_body()
    kept = typed_prompts(tokens, text, start, typed)
    fresh = typed_prompts(tokens, text, start, typed, keep_rows=False)
    assert prefills(fresh) >= 4
    assert prefills(kept) <= prefills(fresh) // 2
    for document, offset, prompt in kept:
        assert len(prompt.ids) <= 512 and tokens.decode(list(prompt.ids)) == prompt.text
        line_start = document.rfind("\n", 0, offset) + 1
        whole = prompt.text + prompt.healed
        assert whole.endswith(document[line_start:offset])
        shown = whole[: len(whole) - (offset - line_start)]
        above = iter(document[:line_start].splitlines(keepends=True))
        assert all(row in above for row in shown.splitlines(keepends=True))  # in order, unchanged
        assert GET_VALUES in shown


def test_rows_nearly_outgrown_are_chosen_again_at_a_pause_not_at_a_keystroke(tokens):
    """Kept rows leave less room with each line typed, and the keystroke that outgrows it has the
    rows chosen again: a prefill from near the prompt's start while the user waits. Where the
    room left at a line's end is short, the server's idle work chooses them then (the pause
    before the next line), and no keystroke's prompt changes before its last line."""
    text, start, typed = get_values_body()
    kept = typed_prompts(tokens, text, start, typed)
    renewed = typed_prompts(tokens, text, start, typed, renew=True)
    renewals = sum(offset is None for _, offset, _ in renewed)
    assert prefills(kept) >= 2 and renewals >= 2
    assert prefills(renewed, at_keystrokes=True) == 0
    keystrokes = [(d, o, p) for d, o, p in renewed if o is not None]
    assert [p.ids[-4:] for _, _, p in keystrokes] == [p.ids[-4:] for _, _, p in kept]  # same lines


def test_rows_chosen_again_wait_apart_until_their_prompt_is_prefilled(tokens):
    """A renewal pre-empted by the next key (its prefill not done) changes no keystroke's prompt:
    they keep the rows whose prompt is in the cache until typing outgrows them, as without
    renewals; and until then each pause's renewal keeps the rows of the one before, whose prefill
    it goes on from (under its own cache key, ``LocalRuntime.renew``)."""
    text, start, typed = get_values_body()
    kept = typed_prompts(tokens, text, start, typed)
    pending = typed_prompts(tokens, text, start, typed, renew=True, adopt=False)
    keystrokes = [p.ids for _, o, p in pending if o is not None]
    assert keystrokes == [p.ids for _, _, p in kept]
    shares, renewal, keystroke = [], None, None
    for _, offset, prompt in pending:
        if offset is None:
            if renewal is not None:
                shares.append(common_prefix_length(renewal, prompt.ids) / len(renewal))
            renewal = prompt.ids
            continue
        if keystroke is not None and common_prefix_length(keystroke, prompt.ids) < len(keystroke) - 16:
            renewal = None  # outgrown: the keystroke chose rows afresh, the renewal starts again
        keystroke = prompt.ids
    assert len(shares) >= 2 and min(shares) > 0.8


def test_rows_are_kept_only_while_they_are_unchanged(tokens):
    """An edit above the cursor (a shown row renamed, a line inserted at the top that moves every
    row down) gives the prompt a fresh builder gives: the kept rows are dropped, not shown again
    at their old row numbers."""
    text = (STDLIB / "argparse.py").read_text()
    start = text.index(GET_VALUES) + len(GET_VALUES)
    cursor = text.index("\n", text.index("\n", start) + 1)  # two lines into the body
    request = ContextRequest(text, cursor, 512, uri="file:///argparse.py")
    renamed = text.replace(GET_VALUES, GET_VALUES.replace("arg_strings", "strings"))
    edits = [
        replace(request, text=renamed, offset=cursor - len("arg_")),
        replace(request, text="import os\n" + text, offset=cursor + len("import os\n")),
    ]
    for edited in edits:
        builder = ContextBuilder()
        assert GET_VALUES in builder.build(request, tokens).text
        assert builder.build(edited, tokens) == ContextBuilder().build(edited, tokens)


# -- token healing in the prompt ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "healed"),
    [
        ("    yield from _iterencode_dic", "dic"),
        ("x = 1\n        ", "\n        "),
        ("    return ", " "),
        ("call(", ""),  # after punctuation: nothing to heal
        ("x = 1\n", "\n"),  # at a line start
        ("name = 'café", "é"),
    ],
)
def test_what_is_backed_up(tokens, before, healed):
    prompt = ContextBuilder().build(ContextRequest(before, len(before), 256, uri="file:///h.py"), tokens)
    assert prompt.healed == healed and prompt.text + prompt.healed == before
    request = ContextRequest(before, len(before), 256, uri="file:///h.py", heal=False)
    unhealed = ContextBuilder().build(request, tokens)
    assert unhealed.healed == "" and unhealed.text == before


def test_non_ascii_before_the_cursor(tokens):
    text = "# Grüße 😀 日本語\ndef größe(wert):\n    return wert * 2  # ½\n\nprint(größe(3), '→ é"
    prompt = ContextBuilder().build(ContextRequest(text, len(text), 128, uri="file:///u.py"), tokens)
    assert prompt.text + prompt.healed == text and len(prompt.ids) <= 128
    assert tokens.decode(list(prompt.ids)) == prompt.text
    item, where = item_for(text + "')", len(text), "', 1)\n")
    assert item == "', 1)" and where == (4, 20, 22)  # UTF-16 columns: 😀-free line, ö and → count 1


# -- fill-in-the-middle -------------------------------------------------------------------------------


FIM_TOKENS = {
    "starcoder": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>"],
    "qwen": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>"],
    "deepseek": ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
    "codellama": ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
}


@pytest.fixture(scope="module")
def fim_tokenizers():
    out = {}
    for style, specials in FIM_TOKENS.items():
        tok = AutoTokenizer.from_pretrained(str(tokenizer_source()))
        tok.add_special_tokens({"additional_special_tokens": specials})
        out[style] = tok
    return out


@pytest.mark.parametrize("style", list(FIM_TOKENS))
def test_fim_prompts_for_tokenizers_with_fim_tokens(fim_tokenizers, style):
    tok = fim_tokenizers[style]
    tokens = Tokens.from_tokenizer(tok)
    text = "def area(r):\n    return 3.14 * r\n\n\ndef perimeter(r):\n    return \n\n\nprint(area(2))\n"
    offset = text.index("    return \n") + len("    return")
    prompt = ContextBuilder().build(ContextRequest(text, offset, 200, uri="file:///geo.py"), tokens)
    assert prompt.fim == style and fim.resolve("auto", tokens).name == style
    template = fim.STYLES[style]
    ids = list(prompt.ids)
    marker_ids = [tokens.special_id(m) for m in fim._markers(template.template)]
    positions = [ids.index(m) for m in marker_ids]
    assert positions == sorted(positions) and positions[0] == 0
    assert prompt.text + prompt.healed == text[:offset] and prompt.suffix == text[offset:]
    if template.line_in_middle:  # the cursor's line after the middle marker, healed there
        assert ids[positions[-1] + 1 :] == tokens.encode(prompt.line)
        assert prompt.line + prompt.healed == "    return"
    else:  # CodeLlama's SentencePiece vocabulary: the whole prefix in its slot
        assert positions[-1] == len(ids) - 1 and prompt.line == ""
    decoded = tok.decode(ids[: positions[-1]])
    assert prompt.healed == " return" and "print(area(2))" in decoded
    assert prompt.text.removesuffix(prompt.line) in decoded
    assert len(ids) <= 200 and set(prompt.stop_strings) >= {template.stops[0]}


def test_fim_can_be_turned_off_or_given_as_a_template(fim_tokenizers):
    tokens = Tokens.from_tokenizer(fim_tokenizers["starcoder"])
    text, offset = "a = 1\nb = \nc = 3\n", len("a = 1\nb =")
    off = ContextBuilder().build(ContextRequest(text, offset, 100, fim_template="none"), tokens)
    assert off.fim is None and off.ids == tuple(tokens.encode("a = 1\nb ="))
    custom = "<fim_suffix>{suffix}<fim_prefix>{prefix}<fim_middle>"  # suffix first (SPM)
    spm = ContextBuilder().build(ContextRequest(text, offset, 100, fim_template=custom, heal=False), tokens)
    ids = list(spm.ids)
    assert ids[0] == tokens.special_id("<fim_suffix>") and ids[-1] == tokens.special_id("<fim_middle>")
    assert tokens.decode(ids) == "<fim_suffix> \nc = 3\n<fim_prefix>a = 1\nb =<fim_middle>"
    plain = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    assert fim.resolve("auto", plain) is None  # SmolLM2 itself has no FIM tokens


def test_a_fim_prompt_heals_the_prefix_and_keeps_the_budget(fim_tokenizers):
    tokens = Tokens.from_tokenizer(fim_tokenizers["qwen"])
    text = "\n".join(f"value_{i} = compute({i})" for i in range(300)) + "\nresult = comp\n" + "x = 1\n" * 300
    offset = text.index("result = comp") + len("result = comp")
    prompt = ContextBuilder().build(ContextRequest(text, offset, 128, uri="file:///big.py"), tokens)
    assert prompt.healed and "result = comp".endswith(prompt.healed) and len(prompt.ids) <= 128
    assert prompt.line + prompt.healed == "result = comp"
    middle = list(prompt.ids).index(tokens.special_id("<|fim_middle|>"))
    assert list(prompt.ids)[middle + 1 :] == tokens.encode(prompt.line)


def test_keystrokes_on_one_line_encode_the_fim_suffix_once(fim_tokenizers):
    """The suffix is the same text at every keystroke on a line (and on the new line below it);
    fitting it to its share encodes it a line shorter at a time, so it is encoded once for all of
    them (``Tokens.ids``), not again at each keystroke, and every prompt shows it whole."""
    base = Tokens.from_tokenizer(fim_tokenizers["qwen"])
    calls: collections.Counter[str] = collections.Counter()

    def encode(text: str) -> list[int]:
        calls[text] += 1
        return base.encode(text)

    tokens = Tokens(encode=encode, decode=base.decode, vocab=base.vocab)
    body = "\n".join(f"x_{i} = {i}" for i in range(200)) + "\n"
    start, builder, suffixes = len(body), ContextBuilder(), set()
    for k in range(len("total = x_1 + x_2") + 1):
        text = body + "total = x_1 + x_2"[:k] + "\n" + "\n".join(f"y_{i} = {i}" for i in range(300))
        prompt = builder.build(ContextRequest(text, start + k, 256, uri="file:///s.py"), tokens)
        assert prompt.fim == "qwen" and prompt.suffix.startswith("\ny_0 = 0\n")
        suffixes.add(prompt.suffix)
    (suffix,) = suffixes
    assert calls[suffix] == 1 and max(calls[t] for t in calls if t.startswith("\ny_0")) == 1


# -- snippets from other open documents -------------------------------------------------------------------


HELPERS = """import math


def circle_area(radius):
    return math.pi * radius ** 2


def circle_perimeter(radius):
    return 2 * math.pi * radius


def square_area(side):
    return side * side
"""


def test_similar_code_from_another_open_document_comes_first_as_comments(tokens):
    text = (
        "from helpers import circle_area\n\n\ndef report(radius):\n    area = circle_area(radius)\n"
        "    perimeter = "
    )
    others = (
        OpenDocument("file:///w/helpers.py", HELPERS),
        OpenDocument("file:///w/notes.txt", "lunch at noon\n" * 30),
    )
    # the snippets alone (definitions, on by default, have tests of their own: test_cross_file.py)
    request = ContextRequest(text, len(text), 256, uri="file:///w/main.py", others=others, cross_file=False)
    prompt = ContextBuilder().build(request, tokens)  # a 12-line window is cut to fit its share
    assert prompt.snippets and prompt.snippets[0].uri == "file:///w/helpers.py"
    assert prompt.text.startswith("# Compare this snippet from w/helpers.py:\n# import math\n")
    assert "# def circle_area(radius):" in prompt.text and "lunch" not in prompt.text
    assert prompt.text.endswith("    perimeter =") and len(prompt.ids) <= 256
    request = replace(request, budget_tokens=1024)
    roomy = ContextBuilder().build(request, tokens)
    assert "# def circle_perimeter(radius):" in roomy.text
    none = ContextBuilder().build(
        replace(request, neighbor_snippets=0),
        tokens,
    )
    assert not none.snippets and not none.text.startswith("#")


def test_snippets_are_deduplicated():
    index = SnippetIndex()
    query = "area = circle_area(radius)\nperimeter = circle_perimeter(radius)"
    docs = [OpenDocument("file:///a.py", HELPERS), OpenDocument("file:///b.py", HELPERS)]
    chosen = index.choose(query, docs, 3)
    texts = [c.text for c in chosen]
    assert len(texts) == len(set(texts)) and len(chosen) >= 1
    assert index.choose(query, docs, 3, exclude=HELPERS) == []  # already in the prompt


# -- parsing --------------------------------------------------------------------------------------------


def test_incremental_reparse_gives_the_same_tree_as_a_fresh_parse():
    text = (STDLIB / "argparse.py").read_text()
    cache = ParseCache()
    window = window_for(text, len(text) // 2)
    first = cache.parse("file:///a.py", text, window, "python")
    assert first is not None and not first.incremental
    edited = text[: len(text) // 2] + "x = [1, 2,\n" + text[len(text) // 2 :]
    again = cache.parse("file:///a.py", edited, window_for(edited, len(text) // 2), "python")
    fresh = ParseCache().parse("file:///b.py", edited, window_for(edited, len(text) // 2), "python")
    assert again.incremental and str(again.tree.root_node) == str(fresh.tree.root_node)
    assert cache.full_parses == 1 and cache.incremental_parses == 1


def test_languages_from_the_id_then_the_extension_then_plain_text():
    assert detect("typescriptreact", "file:///a.py").name == "tsx"
    assert detect(None, "file:///w/x.rs").name == "rust" and detect("", "file:///w/X.JAVA").name == "java"
    assert detect("cobol", "file:///w/a.cob").name == "text" and detect(None, "untitled:1").name == "text"
    assert detect(None, "file:///w/a%20b.hpp").name == "cpp"
    for name in ("python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp"):
        assert grammar(name) is not None, name


# -- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "offset", "uri", "language_id"),
    [
        ("", 0, "file:///e.py", "python"),
        ("def f():\n    return 1\n", 0, "file:///s.py", "python"),  # cursor at 0
        ("def f():\n    return 1\n", 22, "file:///s.py", "python"),  # at the end
        (
            "\x00\xff\ufffd\ud800 garbage \x1b[0m\n" * 50,
            300,
            "file:///bin.py",
            "python",
        ),  # junk, lone surrogate
        (bytes(range(256)).decode("latin-1") * 20, 2000, "file:///bin.c", "c"),
        ("some prose\n\nmore prose and so on", 20, "file:///notes.unknown", "made-up-language"),
        ("{" * 3000 + "x", 3001, "file:///deep.js", "javascript"),  # deep nesting
        ("x" * 100_000, 50_000, "file:///long.ts", None),  # one huge line
    ],
)
def test_bad_input_never_crashes_and_keeps_the_budget(tokens, text, offset, uri, language_id):
    request = ContextRequest(text, offset, 64, uri=uri, language_id=language_id)
    prompt = ContextBuilder().build(request, tokens)
    assert len(prompt.ids) <= 64
    assert tokens.decode(list(prompt.ids)) == prompt.text


def test_a_10_mb_document_is_parsed_in_a_window(tokens):
    block = "".join(f"def function_{i}(value):\n    return value * {i}\n\n" for i in range(200))
    text = block * (10_000_000 // len(block) + 1)
    builder = ContextBuilder()
    prompt = builder.build(ContextRequest(text, len(text), 512, uri="file:///huge.py"), tokens)
    assert len(prompt.ids) <= 512 and len(text) > 20 * FULL_PARSE_CHARS
    (entry,) = builder.parses._entries.values()
    assert len(entry.source) < 2 * FULL_PARSE_CHARS  # a window, not 10 MB
    assert (prompt.text + prompt.healed).endswith("return value * 199\n\n") and prompt.healed == "\n\n"


def test_split_rows_breaks_at_newlines_only():
    assert split_rows("a\r\nb\x0cc\n") == ["a\r\n", "b\x0cc\n", ""]
    assert Window(0, 0, 0).start == 0


def test_the_edit_diff_is_exact_across_chunks(monkeypatch):
    from speculative_complete.lsp_server.context import syntax

    monkeypatch.setattr(syntax, "_CHUNK", 4)
    rng = random.Random(7)
    for _ in range(2000):
        a = bytes(rng.randrange(3) for _ in range(rng.randrange(40)))
        b = bytearray(a)
        for _ in range(rng.randrange(3)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(3)
        b = bytes(b[: rng.randrange(len(b) + 1)] if rng.random() < 0.3 else b) + bytes(rng.randrange(3))
        p = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
        limit = min(len(a), len(b)) - p
        s = next((i for i in range(limit) if a[-1 - i] != b[-1 - i]), limit)
        assert (syntax.common_prefix(a, b), syntax.common_suffix(a, b, limit)) == (p, s)
