"""The server's pure parts without a process: settings layering, the prompt window, post-processing,
LSP line breaks and cursor positions, statistics."""

from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.workspace import PositionCodec

from speculative_complete.decoding.choices import DRAFTER_NAMES, QUANTIZATIONS
from speculative_complete.lsp_server import config
from speculative_complete.lsp_server.documents import LspTextDocument, PositionError, locate, lsp_lines
from speculative_complete.lsp_server.postprocess import merge_with_suffix
from speculative_complete.lsp_server.stats import ServerStats, percentile

# -- settings ---------------------------------------------------------------------------------------


def test_every_drafter_and_quantization_name_is_a_setting_and_no_other():
    """The names are declared once (``speculative_complete.decoding.choices``); the settings accept
    exactly them."""
    for name in DRAFTER_NAMES:
        assert config.from_cli(drafter=name, draft_model="a-draft").settings.drafter == name
    for name in QUANTIZATIONS:
        assert config.from_cli(quantization=name).settings.quantization == name
    assert config.from_cli(drafter="eagle").problems
    assert config.from_cli(quantization="int3").problems


def test_defaults_then_cli_then_init_then_client_with_flat_or_nested_payloads():
    cli = config.from_cli(model="/models/a", device="cpu")
    assert not cli.problems and cli.settings.model == "/models/a" and cli.settings.device == "cpu"
    init = config.layer(cli.settings, cli.settings, {"lspServer": {"maxNewTokens": 10, "device": "cuda:1"}})
    assert init.settings.max_new_tokens == 10 and init.settings.device == "cuda:1"
    client = config.layer(init.settings, init.settings, {"debounceMs": 0, "enabled": False})
    got = client.settings
    assert (got.debounce_ms, got.enabled, got.max_new_tokens) == (0, False, 10)
    # A later payload replaces the client layer: keys it lacks fall back to the init layer.
    again = config.layer(client.settings, init.settings, {"debounceMs": 5})
    assert again.settings.enabled is True and again.settings.debounce_ms == 5


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("maxNewTokens", 0),
        ("maxNewTokens", "64"),
        ("maxNewTokens", 2.5),
        ("maxNewTokens", True),
        ("contextTokens", 10**9),
        ("debounceMs", -1),
        ("timeBudgetMs", None),
        ("firstAnswerMs", -1),
        ("enabled", "yes"),
        ("drafter", "fast"),
        ("device", "tpu"),
        ("dtype", "int4"),
        ("model", ""),
        ("model", 3),
        ("draftModel", 5),
        ("multiline", 1),
        ("kvCacheMb", -1),
        ("typeAhead", "on"),
        ("prefetch", None),
        ("decoder", "llama.cpp"),
        ("multiline", "sometimes"),
        ("maxLines", 0),
        ("fimTemplate", "gpt"),
        ("neighborSnippets", 11),
        ("tokenHealing", "on"),
        ("workspaceIndexMb", -1),
        ("workspaceIndexMb", 2048),
    ],
)
def test_a_bad_value_keeps_the_current_one_and_says_why(key, value):
    current = config.Settings(max_new_tokens=33, enabled=False)
    result = config.layer(current, config.Settings(), {key: value})
    name = config._BY_CAMEL[key]
    assert getattr(result.settings, name) == getattr(current, name)
    (problem,) = result.problems
    assert problem.startswith(f"setting {key} = ") and "ignored: expected" in problem and "keeping" in problem


def test_integral_floats_are_accepted_and_unknown_keys_are_noted():
    result = config.layer(config.Settings(), config.Settings(), {"maxNewTokens": 32.0, "colour": "red"})
    assert result.settings.max_new_tokens == 32 and not result.problems
    assert result.unknown and "'colour'" in result.unknown[0]


def test_a_payload_that_is_not_an_object_is_a_problem():
    assert config.layer(config.Settings(), config.Settings(), [1, 2]).problems
    assert config.layer(config.Settings(), config.Settings(), {"lspServer": 3}).problems
    assert not config.layer(config.Settings(), config.Settings(), None).problems


def test_the_model_drafter_needs_a_draft_model():
    result = config.layer(config.Settings(), config.Settings(), {"drafter": "model"})
    assert result.settings.drafter == "auto" and "needs draftModel" in result.problems[0]
    ok = config.layer(config.Settings(), config.Settings(), {"drafter": "model", "draftModel": "/d"})
    assert ok.settings.drafter == "model" and not ok.problems


def test_to_lsp_uses_the_documented_names():
    assert set(config.Settings().to_lsp()) == {
        "model",
        "draftModel",
        "draftHead",
        "drafter",
        "device",
        "dtype",
        "quantization",
        "maxNewTokens",
        "contextTokens",
        "debounceMs",
        "timeBudgetMs",
        "firstAnswerMs",
        "enabled",
        "multiline",
        "kvCacheMb",
        "typeAhead",
        "prefetch",
        "decoder",
        "maxLines",
        "fimTemplate",
        "neighborSnippets",
        "crossFileContext",
        "tokenHealing",
        "workspaceIndexMb",
        "endpoint",
        "endpointApi",
        "endpointModel",
        "apiKeyEnv",
        "caBundle",
        "allowInsecureEndpoint",
    }


def test_multiline_takes_a_mode_or_the_old_booleans_and_fim_a_style_or_a_template():
    layered = config.layer(config.Settings(), config.Settings(), {"multiline": True})
    assert layered.settings.multiline == "always" and not layered.problems
    layered = config.layer(config.Settings(), config.Settings(), {"multiline": False})
    assert layered.settings.multiline == "never"
    assert config.Settings().multiline == "auto"
    custom = "<PRE>{prefix}<SUF>{suffix}<MID>"
    layered = config.layer(config.Settings(), config.Settings(), {"fimTemplate": custom})
    assert layered.settings.fim_template == custom
    assert config.layer(config.Settings(), config.Settings(), {"fimTemplate": "<PRE>{prefix}"}).problems


# -- post-processing ----------------------------------------------------------------------------------


def test_merge_with_suffix():
    assert merge_with_suffix("foo(a)", ")") == "foo(a)"
    assert merge_with_suffix("x + 1", "  # note") == "x + 1  # note"
    assert merge_with_suffix("x)", "):") == "x):"


# -- documents and cursors ------------------------------------------------------------------------------


def test_lsp_lines_break_only_at_lsp_line_ends():
    text = "a\x0cb\u2028c\x85d\ne\r\nf\rg"
    assert lsp_lines(text) == ["a\x0cb\u2028c\x85d\n", "e\r\n", "f\r", "g"]
    assert lsp_lines("x\ny\n") == "x\ny\n".splitlines(keepends=True)
    assert lsp_lines("") == []


def document(text: str, encoding: str = "utf-16") -> LspTextDocument:
    return LspTextDocument("file:///t.py", text, position_codec=PositionCodec(encoding=encoding))


@pytest.mark.parametrize(("encoding", "character"), [("utf-16", 9), ("utf-8", 12), ("utf-32", 8)])
def test_locate_converts_code_units_and_splits_the_line(encoding, character):
    doc = document("# top\nx = 'é😀' + y)\n", encoding)
    cursor = locate(doc, types.Position(1, character))
    assert cursor.before == "x = 'é😀'" and cursor.after == " + y)"
    assert cursor.offset == len("# top\n") + 8 and cursor.character == character
    assert cursor.end_character == {"utf-16": 14, "utf-8": 17, "utf-32": 13}[encoding]


def test_locate_clamps_the_character_and_rejects_lines_past_the_end():
    doc = document("ab\ncd\n")
    assert locate(doc, types.Position(1, 99)).character == 2
    assert locate(doc, types.Position(2, 0)).offset == 6  # the empty line after the last break
    with pytest.raises(PositionError, match="line 3 is beyond the end of the document"):
        locate(doc, types.Position(3, 0))
    assert locate(document(""), types.Position(0, 0)).offset == 0
    with pytest.raises(PositionError):
        locate(document("no newline"), types.Position(1, 0))
    inside_pair = locate(document("😀x"), types.Position(0, 1))  # half an emoji rounds up
    assert inside_pair.character == 2 and inside_pair.before == "😀"


# -- statistics --------------------------------------------------------------------------------------


def test_percentiles_and_generation_totals():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    from speculative_complete.decoding.engine.loop import DrafterStats, GenerationResult, GenerationStats

    stats = ServerStats()
    generation = GenerationStats(
        produced_tokens=12,
        target_passes=4,
        prefill_tokens=6,
        known_tokens=5,
        prefill_ms=30.0,
        decode_ms=100.0,
        draft_ms=10.0,
        verify_ms=80.0,
        drafters={"ngram": DrafterStats(drafts=2, proposed=8, accepted=6)},
    )
    stats.record_generation(GenerationResult("x", [1], "stop", generation))
    stats.record_phases(queue_ms=1.0, prompt_ms=2.0, stats=generation, post_ms=0.5)
    stats.answer(10.0, empty=False)
    snap = stats.snapshot()
    assert snap["tokens_per_pass"] == 3.0 and snap["stop_reasons"] == {"stop": 1}
    assert snap["tokens_per_pass_after_prefill"] == 2.0  # (12 - 6) tokens over (4 - 1) passes
    assert snap["known_tokens"] == 5
    assert snap["drafters"] == {"ngram": {"proposed": 8, "accepted": 6, "acceptance": 0.75}}
    assert snap["latency_ms"] == {"p50": 10.0, "p95": 10.0} and snap["answered"] == 1
    phases = {name: value["p50"] for name, value in snap["phases_ms"].items()}
    assert phases == {
        "queue": 1.0,
        "prompt": 2.0,
        "prefill": 30.0,
        "draft": 10.0,
        "verify": 80.0,
        "decode_other": 10.0,
        "postprocess": 0.5,
    }
    from speculative_complete.lsp_server.completion import Decoded, _decode_note
    from speculative_complete.lsp_server.context.builder import Prompt
    from speculative_complete.lsp_server.scheduler import Outcome

    note = _decode_note(
        Decoded(GenerationResult("x", [1], "stop", generation), 2.0, Prompt("p")), Outcome("done")
    )
    assert "4 passes, 3.00/pass (2.00 after the prefill)" in note  # the per-answer debug line
