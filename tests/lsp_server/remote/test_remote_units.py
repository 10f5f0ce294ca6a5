"""The remote engine's pure parts: settings and URL rules, the stream's lines, the two APIs' events,
the outage/recovery state machine and the stats block. No socket, no engine."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from speculative_complete.lsp_server import config
from speculative_complete.lsp_server.context.builder import ContextBuilder, ContextRequest
from speculative_complete.lsp_server.context.tokens import Tokens
from speculative_complete.lsp_server.endpoint import API_NAMES, insecure_reason, is_loopback, parse_base_url
from speculative_complete.lsp_server.remote import EndpointConfig, EndpointError
from speculative_complete.lsp_server.remote.dialects import (
    LlamaCppDialect,
    OpenAIDialect,
    dialect,
    parse_text,
    parse_tokens,
)
from speculative_complete.lsp_server.remote.gate import Gate, gbnf_literal, prefix_grammar
from speculative_complete.lsp_server.remote.health import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    SOFT_FAILURES_FOR_OUTAGE,
    Health,
)
from speculative_complete.lsp_server.remote.request import RemoteRequest
from speculative_complete.lsp_server.remote.sse import DONE, MalformedEvent, parse_line
from speculative_complete.lsp_server.remote.stats import EndpointStats
from tests.support.lsp import tokenizer_source

# -- settings -----------------------------------------------------------------------------------------


def test_each_api_name_the_settings_accept_speaks_its_own_dialect():
    assert [dialect(name).name for name in API_NAMES] == list(API_NAMES)


def test_no_endpoint_by_default_so_nothing_reaches_the_network():
    assert config.Settings().endpoint is None
    assert EndpointConfig.from_settings(config.Settings()) is None


def test_endpoint_settings_layer_and_build_a_config():
    layered = config.layer(
        config.Settings(),
        config.Settings(),
        {
            "lspServer": {
                "endpoint": "https://gpu-box:8000/v1/",
                "endpointApi": "llama.cpp",
                "endpointModel": "qwen",
                "apiKeyEnv": "TEAM_TOKEN",
                "caBundle": "/etc/team-ca.pem",
            }
        },
    )
    assert not layered.problems
    got = EndpointConfig.from_settings(layered.settings)
    assert got is not None and got.url.text == "https://gpu-box:8000/v1"
    assert (got.api, got.model, got.api_key_env, got.ca_bundle) == (
        "llama.cpp",
        "qwen",
        "TEAM_TOKEN",
        "/etc/team-ca.pem",
    )
    # null (or "") switches back to the local engine
    back = config.layer(layered.settings, config.Settings(), {"endpoint": None})
    assert back.settings.endpoint is None and not back.problems


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("endpoint", "ftp://gpu-box/"),
        ("endpoint", 8000),
        ("endpoint", "https://"),
        ("endpoint", "gpu-box:8000"),
        ("endpoint", "https://gpu-box/v1?x=1"),
        ("endpointApi", "vllm"),
        ("endpointModel", 3),
        ("apiKeyEnv", "MY-TOKEN"),
        ("caBundle", 1),
        ("allowInsecureEndpoint", "yes"),
    ],
)
def test_a_bad_endpoint_value_keeps_the_current_one(key, value):
    current = config.Settings(endpoint="http://127.0.0.1:8080")
    result = config.layer(current, config.Settings(), {key: value})
    name = config._BY_CAMEL[key]
    assert getattr(result.settings, name) == getattr(current, name)
    (problem,) = result.problems
    assert problem.startswith(f"setting {key} = ") and "ignored" in problem and "keeping" in problem


def test_plain_http_only_to_loopback_unless_allowed():
    for url in ("http://127.0.0.1:8080", "http://localhost:8080/v1", "http://[::1]:8080", "http://127.5.0.1"):
        assert insecure_reason(url, False) is None, url
    for url in ("http://gpu-box:8000/v1", "http://10.1.2.3:8000", "http://localhost.example.com"):
        assert insecure_reason(url, False) is not None, url
        assert insecure_reason(url, True) is None
        with pytest.raises(EndpointError):
            EndpointConfig.create(url)
    current = config.Settings(endpoint="https://gpu-box")
    refused = config.layer(current, config.Settings(), {"endpoint": "http://gpu-box:8000"})
    assert refused.settings.endpoint == "https://gpu-box" and "allowInsecureEndpoint" in refused.problems[0]
    allowed = config.layer(
        current, config.Settings(), {"endpoint": "http://gpu-box:8000", "allowInsecureEndpoint": True}
    )
    assert allowed.settings.endpoint == "http://gpu-box:8000" and not allowed.problems
    # withdrawing the permission drops an insecure endpoint rather than keep using it
    withdrawn = config.layer(allowed.settings, config.Settings(), {"endpoint": "http://gpu-box:8000"})
    assert withdrawn.settings.endpoint is None and withdrawn.problems


def test_a_loopback_name_is_taken_literally_never_resolved():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("my-laptop") and not is_loopback("0.0.0.0")


def test_secrets_are_not_repeated_in_problems():
    key = "sk-live-0123456789abcdef"
    result = config.layer(
        config.Settings(), config.Settings(), {"apiKeyEnv": key, "endpoint": f"https://user:{key}@gpu-box"}
    )
    assert len(result.problems) == 2 and all(key not in p for p in result.problems)
    assert "apiKeyEnv" in result.problems[0] and "password" in result.problems[1]


def test_the_cli_flags_have_the_settings_names():
    from speculative_complete.lsp_server.__main__ import REMOTE_FLAGS, parse_args

    args = parse_args(
        [
            "--endpoint",
            "https://gpu-box:8000/v1",
            "--endpoint-api",
            "llama.cpp",
            "--endpoint-model",
            "m",
            "--api-key-env",
            "TOKEN",
            "--ca-bundle",
            "/ca.pem",
        ]
    )
    cli = config.from_cli(**{n: getattr(args, n) for n in REMOTE_FLAGS if getattr(args, n) is not None})
    assert not cli.problems
    assert (
        cli.settings.to_lsp() | {}
        == config.Settings(
            endpoint="https://gpu-box:8000/v1",
            endpoint_api="llama.cpp",
            endpoint_model="m",
            api_key_env="TOKEN",
            ca_bundle="/ca.pem",
        ).to_lsp()
    )
    with pytest.raises(SystemExit):
        parse_args(["--endpoint", "http://gpu-box:8000"])
    assert parse_args(
        ["--endpoint", "http://gpu-box:8000", "--allow-insecure-endpoint"]
    ).allow_insecure_endpoint


# -- the stream and the APIs ---------------------------------------------------------------------------


def test_stream_lines():
    assert parse_line('data: {"content": "x"}') == {"content": "x"}
    assert parse_line("data: [DONE]") is DONE
    assert parse_line("") is None and parse_line(": keep-alive") is None and parse_line("event: x") is None
    assert parse_line('{"error": {"message": "bad"}}') == {"error": {"message": "bad"}}
    for bad in ("data: {not json", "data: [1, 2]", "<html>502 Bad Gateway</html>"):
        with pytest.raises(MalformedEvent):
            parse_line(bad)


def test_the_openai_request_and_events():
    url = parse_base_url("https://gpu-box:8000/v1")
    path, body = OpenAIDialect().completion(
        url, RemoteRequest("def f(", suffix=")\n", stop=("\n",), max_tokens=9), "qwen", True
    )
    assert path == "https://gpu-box:8000/v1/completions"
    assert body["prompt"] == "def f(" and body["suffix"] == ")\n" and body["stop"] == ["\n"]
    assert (body["max_tokens"], body["temperature"], body["stream"], body["model"]) == (9, 0.0, True, "qwen")
    path, body = OpenAIDialect().completion(
        parse_base_url("http://127.0.0.1:8080"), RemoteRequest([1, 2]), None, False
    )
    assert path == "http://127.0.0.1:8080/v1/completions" and body["prompt"] == [1, 2]
    assert "model" not in body and "suffix" not in body
    chunk = OpenAIDialect().chunk({"choices": [{"text": "ab", "finish_reason": None}]})
    assert (chunk.text, chunk.finish) == ("ab", None)
    assert (
        OpenAIDialect().chunk({"choices": [{"text": "", "finish_reason": "length"}]}).finish == "max_tokens"
    )
    usage = OpenAIDialect().chunk(
        {
            "choices": [],
            "usage": {
                "completion_tokens": 4,
                "prompt_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        }
    )
    assert (usage.new_tokens, usage.prompt_tokens, usage.cached_tokens) == (4, 10, 8)
    assert OpenAIDialect().chunk({"error": {"message": "overloaded"}}).error == "overloaded"
    tokenize, _ = OpenAIDialect().tokenize(url, "x", None)
    assert tokenize == "https://gpu-box:8000/tokenize"


def test_infill_gets_the_cursors_line_as_its_prompt():
    """The cursor's line goes in ``/infill``'s ``prompt`` (as llama.vim sends it; documented to
    follow the middle marker), so keystrokes on one line leave ``input_prefix`` and
    ``input_suffix`` as they were."""
    tokens = Tokens.from_tokenizer(AutoTokenizer.from_pretrained(str(tokenizer_source())))
    url, line = parse_base_url("http://127.0.0.1:8080"), "    return 2 * math.pi * r"
    above, below = "import math\n\n\ndef perimeter(r):\n", "\n\n\nprint(perimeter(2))\n"
    held = set()
    for k in range(len("    r"), len(line) + 1):
        text, offset = above + line[:k] + below, len(above) + k
        prompt = ContextBuilder().build(ContextRequest(text, offset, 256, engine_suffix=True), tokens)
        request = RemoteRequest(
            prompt.text, suffix=prompt.suffix, line=prompt.line, required_prefix=prompt.healed
        )
        path, body = LlamaCppDialect().completion(url, request, None, True)
        assert path.endswith("/infill") and body["prompt"] + prompt.healed == line[:k]
        assert body["input_prefix"] + body["prompt"] + prompt.healed == text[:offset]
        held.add((body["input_prefix"], body["input_suffix"]))
    assert held == {(above, below)}


def test_the_llama_cpp_request_and_events():
    url = parse_base_url("http://127.0.0.1:8080")
    path, body = LlamaCppDialect().completion(url, RemoteRequest("def f(", stop=("\n",)), None, False)
    assert path.endswith("/completion") and body["cache_prompt"] is True and body["prompt"] == "def f("
    path, body = LlamaCppDialect().completion(url, RemoteRequest("def f(", suffix=")\n"), None, True)
    assert path.endswith("/infill") and (body["input_prefix"], body["input_suffix"]) == ("def f(", ")\n")
    chunk = LlamaCppDialect().chunk({"content": " x", "tokens": [7], "stop": False})
    assert (chunk.text, chunk.tokens, chunk.finish) == (" x", [7], None)
    final = LlamaCppDialect().chunk(
        {
            "content": "",
            "stop": True,
            "stop_type": "word",
            "tokens_predicted": 3,
            "timings": {"cache_n": 5, "prompt_n": 2},
        }
    )
    assert (final.finish, final.new_tokens, final.prompt_tokens, final.cached_tokens) == ("stop", 3, 7, 5)
    assert LlamaCppDialect().chunk({"stop": True, "stop_type": "eos"}).finish == "eos"
    assert LlamaCppDialect().chunk({"stop": True, "stop_type": "limit"}).finish == "max_tokens"


def test_detokenize_answers():
    assert parse_text({"content": "def"}) == "def" and parse_text({"prompt": " x"}) == " x"
    assert parse_text({"tokens": []}) is None and parse_text([1]) is None


def test_token_lists():
    assert parse_tokens({"tokens": [1, 2]}) == [1, 2]
    assert parse_tokens([{"id": 3, "text": "a"}]) == [3]
    assert parse_tokens({"tokens": ["a"]}) is None and parse_tokens("x") is None


# -- outage and recovery ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_notice_per_outage_backoff_and_one_on_recovery():
    clock, seen = Clock(), []
    health = Health("endpoint E", seen.append, clock)
    assert health.admit() is None
    health.success()
    assert health.status == "up" and not seen
    health.failure("connection refused")
    assert (
        health.status == "down"
        and [n.kind for n in seen] == ["down"]
        and "connection refused" in seen[0].message
    )
    assert health.admit() is not None  # backing off: no network
    clock.now += FIRST_BACKOFF_S
    assert health.admit() is None  # the probe
    assert health.admit() is not None  # only one probe per backoff
    health.failure("connection refused")
    assert len(seen) == 1 and health.backoff_s == 2 * FIRST_BACKOFF_S
    for _ in range(20):
        clock.now += health.backoff_s
        assert health.admit() is None
        health.failure("connection refused")
    assert health.backoff_s == MAX_BACKOFF_S and len(seen) == 1
    clock.now += MAX_BACKOFF_S
    assert health.admit() is None
    health.success()
    assert [n.kind for n in seen] == ["down", "recovered"] and health.admit() is None
    assert [n.kind for n in health.take_notices()] == ["down", "recovered"] and health.take_notices() == []
    assert health.outages == 1


def test_timeouts_make_an_outage_only_in_a_row():
    health = Health("E", clock=Clock())
    for _ in range(SOFT_FAILURES_FOR_OUTAGE - 1):
        health.failure("timed out", hard=False)
    health.success()
    for _ in range(SOFT_FAILURES_FOR_OUTAGE - 1):
        health.failure("timed out", hard=False)
    assert health.status == "up"
    health.failure("timed out", hard=False)
    assert health.status == "down"


def test_stats_percentiles_and_counters():
    stats = EndpointStats()
    for ms in (10.0, 20.0, 30.0, 40.0):
        stats.record(requests=1, ttft_ms=ms, ttlt_ms=ms * 2, tokens=3)
    stats.record(errors=1, last_error="HTTP 503 error", ttft_ms=None)
    snap = stats.snapshot("http://127.0.0.1:1", "openai", "up", 0)
    assert (snap["requests"], snap["errors"], snap["tokens"], snap["last_error"]) == (
        4,
        1,
        12,
        "HTTP 503 error",
    )
    assert snap["ttft_ms"] == {"p50": 20.0, "p95": 40.0} and snap["ttlt_ms"] == {"p50": 40.0, "p95": 80.0}


# -- the gate: healing's required prefix and client-side stops ------------------------------------------


def test_the_gate_removes_the_required_prefix_and_stops_after_it():
    gate = Gate("\n    ", ("\n",))  # a healed line start: the prefix holds the stop string itself
    assert [gate.feed(p) for p in ("\n", "  ", "  re", "turn x", "\n", "more")] == [
        "go",
        "go",
        "go",
        "go",
        "stop",
        "stop",
    ]
    assert gate.answer == "return x" and gate.prefix_met is True


def test_the_gate_ends_empty_when_the_text_strays_from_the_prefix():
    gate = Gate(" sy", ("\n",))
    assert gate.feed(" s") == "go" and gate.prefix_met is False  # not spelled out yet
    assert gate.feed("ql") == "unmet" and gate.answer == "" and gate.prefix_met is False
    plain = Gate("", ("\n",))
    assert plain.feed("ab") == "go" and plain.answer == "ab" and plain.prefix_met is None
    assert plain.feed("c\nd") == "stop" and plain.answer == "abc"


def test_a_prefix_grammar_is_a_gbnf_literal():
    assert gbnf_literal('a"b\\c\n\t') == '"a\\"b\\\\c\\n\\t"'
    assert prefix_grammar("  x") == 'root ::= "  x" [^\\x00]*'
    # after the user's whitespace, no more of it (the local engine's healing rule)
    assert prefix_grammar("\n  ") == 'root ::= "\\n  " ([^ \\t\\n\\r\\x00] [^\\x00]*)?'


def test_with_a_required_prefix_the_stops_are_left_to_the_gate():
    url = parse_base_url("http://127.0.0.1:8080")
    healed = RemoteRequest([1, 2], stop=("\n",), required_prefix="\n  ")
    _, body = LlamaCppDialect().completion(url, healed, None, False)
    assert "stop" not in body and body["grammar"] == prefix_grammar("\n  ")
    _, body = OpenAIDialect().completion(url, healed, None, False)
    assert "stop" not in body and "grammar" not in body


def test_a_notice_callback_may_read_the_state():
    seen = []
    health = Health("E", lambda notice: seen.append((notice.kind, health.status, health.admit())), Clock())
    health.failure("refused")
    health.success()
    assert [(kind, status) for kind, status, _ in seen] == [("down", "down"), ("recovered", "up")]
