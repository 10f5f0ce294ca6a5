"""``speculative_complete.decoding.engine.stops``: where a generation's text ends, decided on decoded text.

The decoders here are real ones over small vocabularies: one of text pieces, and one of raw
bytes decoded as UTF-8 the way byte-level tokenizers do (a character split across tokens reads
as U+FFFD until its last byte arrives)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from speculative_complete.decoding.engine.stops import (
    Cut,
    EndingTokens,
    covered,
    cut_at_stop,
    tokens_before,
    whole_lines,
)


def pieces_decoder(pieces: Sequence[str]):
    """Token i decodes to ``pieces[i]``; also counts the calls."""
    calls: list[tuple[int, ...]] = []

    def decode(ids: Sequence[int]) -> str:
        calls.append(tuple(ids))
        return "".join(pieces[i] for i in ids)

    decode.calls = calls  # type: ignore[attr-defined]
    return decode


def bytes_decoder(pieces: Sequence[bytes]):
    def decode(ids: Sequence[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    return decode


NO_EOS: frozenset[int] = frozenset()


def tokens_of(*pieces: str):
    """A decoder whose vocabulary is ``pieces`` and the ids 0..n-1 that spell them in order."""
    return pieces_decoder(pieces), list(range(len(pieces)))


# -- covered --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "prefix", "expected"),
    [
        ("def f(x)", "", 0),  # nothing required
        ("def f(x)", "def f(", 6),  # all of it generated
        ("def f(", "def f(", 6),  # exactly it
        ("de", "def f(", 2),  # still inside it
        ("", "def f(", 0),  # nothing generated yet
        ("dEF F(x", "def f(", 6),  # a tokenizer that normalized it: as many characters
        ("éa", "é", 1),  # characters, not bytes
    ],
)
def test_covered_counts_the_characters_of_the_required_prefix(text, prefix, expected):
    assert covered(text, prefix) == expected


# -- tokens_before ------------------------------------------------------------------------------


@pytest.mark.parametrize(("chars", "expected"), [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 3), (99, 3)])
def test_tokens_before_counts_whole_tokens_within_the_characters(chars, expected):
    decode, ids = tokens_of("ab", "cd", "e")
    assert tokens_before(decode, ids, chars) == expected


def test_tokens_before_of_nothing_is_zero():
    decode, _ = tokens_of("ab")
    assert tokens_before(decode, [], 10) == 0


def test_tokens_before_keeps_both_halves_of_a_split_character():
    decode = bytes_decoder([b"\xc3", b"\xa9", b"x"])  # "é" as two tokens
    assert decode([0]) == "\ufffd" and decode([0, 1]) == "é"
    assert tokens_before(decode, [0, 1, 2], 1) == 2


# -- cut_at_stop: EOS and the token limit ----------------------------------------------------------


def test_no_stop_keeps_everything_and_goes_on():
    decode, ids = tokens_of("x", " = ", "1")
    assert cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10) == Cut([0, 1, 2], "x = 1", None, 3)


def test_nothing_generated_is_an_empty_cut_that_goes_on():
    decode, _ = tokens_of("x")
    assert cut_at_stop(decode, [], ("\n",), NO_EOS, max_new=10) == Cut([], "", None, 0)


def test_eos_ends_before_itself_and_counts_as_consumed():
    decode, ids = tokens_of("a", "b", "<eos>", "c")
    assert cut_at_stop(decode, ids, (), frozenset({2}), max_new=10) == Cut([0, 1], "ab", "eos", 3)


def test_eos_first_is_an_empty_answer():
    decode, ids = tokens_of("<eos>", "a")
    assert cut_at_stop(decode, ids, (), frozenset({0}), max_new=10) == Cut([], "", "eos", 1)


def test_the_first_of_several_eos_tokens_ends_it():
    decode, ids = tokens_of("a", "<end>", "b", "<eos>")
    assert cut_at_stop(decode, ids, (), frozenset({1, 3}), max_new=10) == Cut([0], "a", "eos", 2)


@pytest.mark.parametrize(
    ("max_new", "expected"),
    [
        (2, Cut([0, 1], "ab", "max_tokens", 2)),  # over the limit: cut to it
        (3, Cut([0, 1, 2], "abc", "max_tokens", 3)),  # exactly at it: done
        (4, Cut([0, 1, 2], "abc", None, 3)),  # one short: go on
    ],
)
def test_the_token_limit(max_new, expected):
    decode, ids = tokens_of("a", "b", "c")
    assert cut_at_stop(decode, ids, (), NO_EOS, max_new=max_new) == expected


def test_eos_before_the_limit_is_the_reason():
    decode, ids = tokens_of("a", "<eos>", "b", "c")
    assert cut_at_stop(decode, ids, (), frozenset({1}), max_new=3) == Cut([0], "a", "eos", 2)


# -- cut_at_stop: stop strings ----------------------------------------------------------------------


def test_a_stop_inside_one_token_keeps_the_text_before_it_and_only_whole_tokens():
    decode, ids = tokens_of("x = 1", "\ny = 2", "\n")
    # the text runs to the stop; the tokens only as far as they lie wholly before it
    assert cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10) == Cut([0], "x = 1", "stop", 2)


def test_a_stop_split_across_tokens_is_found_and_consumes_up_to_its_last_piece():
    decode, ids = tokens_of("x = 1", "  # e", "nd", " more")
    cut = cut_at_stop(decode, ids, ("# end",), NO_EOS, max_new=10)
    assert cut == Cut([0], "x = 1  ", "stop", 3)


def test_the_earliest_of_several_stops_wins():
    decode, ids = tokens_of("a", ";", "b", "\n\n", "c")
    assert cut_at_stop(decode, ids, ("\n\n", ";"), NO_EOS, max_new=10) == Cut([0], "a", "stop", 2)


def test_a_stop_at_the_very_start_keeps_nothing():
    decode, ids = tokens_of("\n", "a")
    assert cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10) == Cut([], "", "stop", 1)


def test_an_eos_before_a_stop_string_is_the_reason():
    decode, ids = tokens_of("a", "<eos>", "\n")
    assert cut_at_stop(decode, ids, ("\n",), frozenset({1}), max_new=10) == Cut([0], "a", "eos", 2)


def test_a_stop_within_the_token_limit_beats_the_limit():
    decode, ids = tokens_of("a", "\n", "b")
    assert cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=3) == Cut([0], "a", "stop", 2)


def test_a_stop_after_the_token_limit_does_not_count():
    decode, ids = tokens_of("a", "b", "\n")
    assert cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=2) == Cut([0, 1], "ab", "max_tokens", 2)


def test_a_multibyte_stop_split_across_byte_tokens():
    decode = bytes_decoder([b"a", b"\xe2\x86", b"\x92", b"b"])  # "a→b", the arrow in two tokens
    assert cut_at_stop(decode, [0, 1, 2, 3], ("→",), NO_EOS, max_new=10) == Cut([0], "a", "stop", 3)


def test_a_stop_after_a_split_character_keeps_the_whole_character():
    decode = bytes_decoder([b"\xc3", b"\xa9", b"\n", b"z"])  # "é\nz"
    assert cut_at_stop(decode, [0, 1, 2, 3], ("\n",), NO_EOS, max_new=10) == Cut([0, 1], "é", "stop", 3)


# -- cut_at_stop: the required prefix of a healed prompt --------------------------------------------


def test_stops_inside_the_required_prefix_do_not_count():
    decode, ids = tokens_of("a", "\nb", "\n", "c")
    cut = cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10, prefix="a\n")
    assert cut == Cut([0, 1], "b", "stop", 3)


def test_while_still_inside_the_required_prefix_there_is_no_text_yet():
    decode, ids = tokens_of("a", "\n")
    cut = cut_at_stop(decode, ids[:1], ("\n",), NO_EOS, max_new=10, prefix="a\n")
    assert cut == Cut([0], "", None, 1)


def test_the_text_excludes_the_required_prefix():
    decode, ids = tokens_of("self", ".value", " = 3")
    cut = cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10, prefix="self.v")
    assert cut == Cut([0, 1, 2], "alue = 3", None, 3)


# -- cut_at_stop: a caller's own stop ----------------------------------------------------------------


def test_stop_when_cuts_where_the_caller_says():
    """A caller's end (here: a bracket closing one it did not open) cuts like a stop string."""

    def balanced(text: str) -> int | None:
        depth = 0
        for i, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth < 0:
                return i
        return None

    decode, ids = tokens_of("x", ")", " + 1")
    cut = cut_at_stop(decode, ids, (), NO_EOS, max_new=10, stop_when=balanced)
    assert cut == Cut([0], "x", "stop", 2)


@pytest.mark.parametrize(("answer", "text"), [(99, "abc"), (-5, ""), (1, "a")])
def test_stop_when_is_clamped_into_the_text(answer, text):
    decode, ids = tokens_of("a", "b", "c")
    cut = cut_at_stop(decode, ids, (), NO_EOS, max_new=10, stop_when=lambda body: answer)
    assert (cut.text, cut.reason) == (text, "stop")


def test_stop_when_is_not_asked_about_empty_text():
    asked: list[str] = []
    decode, _ = tokens_of("a")
    cut = cut_at_stop(decode, [], (), NO_EOS, max_new=10, stop_when=lambda body: asked.append(body))
    assert cut == Cut([], "", None, 0) and asked == []


def test_the_earlier_of_a_stop_string_and_stop_when_wins():
    decode, ids = tokens_of("ab", "\n", "cd")
    at_c = cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10, stop_when=lambda body: body.find("c"))
    at_b = cut_at_stop(decode, ids, ("\n",), NO_EOS, max_new=10, stop_when=lambda body: 1)
    assert at_c == Cut([0], "ab", "stop", 2)
    assert at_b == Cut([], "a", "stop", 1)


# -- cut_at_stop: the same answer however the tokens arrive ------------------------------------------


@pytest.mark.parametrize(
    "pieces",
    [
        ("de", "f f", "(x", "):", "\n", "    ", "pass"),
        ("x", " =", " [", "1", ",\n", "2]"),
        ("a", "#", " e", "n", "d", "\n"),
        ("é", "\n", "\n"),
    ],
)
def test_consumed_is_where_a_token_by_token_caller_would_have_stopped(pieces):
    """The engine calls ``cut_at_stop`` after every pass, with however many tokens the pass
    accepted: the cut must not depend on how many came at once."""
    decode, ids = tokens_of(*pieces)
    stops = ("\n", "# end")
    whole = cut_at_stop(decode, ids, stops, NO_EOS, max_new=100)
    assert whole.reason == "stop"
    first_stop = next(
        n for n in range(len(ids) + 1) if cut_at_stop(decode, ids[:n], stops, NO_EOS, 100).reason == "stop"
    )
    assert whole.consumed == first_stop
    assert cut_at_stop(decode, ids[:first_stop], stops, NO_EOS, 100) == whole


# -- whole_lines -------------------------------------------------------------------------------------


def always() -> bool:
    return True


def test_whole_lines_gives_the_text_up_to_the_last_line_end_and_its_tokens():
    decode, ids = tokens_of("x = 1", "\n", "y = ", "2\n", "z")
    assert whole_lines(decode, ids, "x = 1\ny = 2\nz", always) == ([0, 1, 2], "x = 1\ny = 2")


def test_whole_lines_waits_until_the_answer_is_due():
    decode, ids = tokens_of("x = 1", "\n", "y")
    assert whole_lines(decode, ids, "x = 1\ny", lambda: False) is None


def test_whole_lines_needs_a_line_with_something_on_it_and_only_then_asks_if_due():
    asked: list[bool] = []

    def due() -> bool:
        asked.append(True)
        return True

    decode, ids = tokens_of("\n", "  \n", "x")
    assert whole_lines(decode, ids, "\n  \nx", due) is None  # only blank lines so far
    assert whole_lines(decode, ids[2:], "x", due) is None  # no line end yet
    assert asked == []


def test_whole_lines_skips_the_required_prefix():
    decode, ids = tokens_of("(", "a", ")\n", "b")
    # the text after the required "(" is "a)\nb": its line is "a)", within which lie "(" and "a"
    assert whole_lines(decode, ids, "a)\nb", always) == ([0, 1], "a)")


# -- EndingTokens ------------------------------------------------------------------------------------


def test_ending_tokens_are_eos_and_tokens_holding_a_stop():
    decode = pieces_decoder(["a", "\n", "b\nc", "<eos>", "}"])
    ends = EndingTokens(decode, ("\n",), frozenset({3}))
    assert [ends(token) for token in range(5)] == [False, True, True, True, False]


def test_ending_tokens_decode_each_token_once():
    decode = pieces_decoder(["a", "\n"])
    ends = EndingTokens(decode, ("\n",), NO_EOS)
    for _ in range(3):
        ends(0), ends(1)
    assert sorted(decode.calls) == [(0,), (1,)]


def test_a_stop_split_across_tokens_ends_at_neither_piece():
    """Only a token that holds a whole stop ends a generation wherever it comes."""
    ends = EndingTokens(pieces_decoder(["\n", "\n\n"]), ("\n\n",), NO_EOS)
    assert (ends(0), ends(1)) == (False, True)


@pytest.mark.parametrize(("tokens", "expected"), [([0, 0, 1, 0], 2), ([0, 0], 2), ([], 0), ([2], 0)])
def test_length_before_counts_the_tokens_before_the_first_ending_one(tokens, expected):
    ends = EndingTokens(pieces_decoder(["a", "\n", "<eos>"]), ("\n",), frozenset({2}))
    assert ends.length_before(tokens) == expected
