"""The remote engine against the real llama.cpp server on the embedded GGUF, over both of its APIs:
completions to the line end, token ids in and out, ``/tokenize``, a cancel that really stops the
engine's generation (its own ``/metrics`` say so), the time budget, a wrong key against
``--api-key``, and the engine killed mid-stream and restarted.

The binary is built once per machine by ``benchmarks.llama_server`` (``.ci/run`` does it before
the tests; cached by version). One server serves the module; the tests that kill or lock one start
their own.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from benchmarks.llama_server import LlamaServer, free_port, llama_server_binary
from speculative_complete.lsp_server.remote import EndpointConfig, RemoteEngine, RemoteRequest
from speculative_complete.lsp_server.remote.health import FIRST_BACKOFF_S
from tests.support.llama_server import THREADS, gguf

APIS = ("llama.cpp", "openai")
PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    path = os.path.join("
LONG = "numbers = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy: ~150 tokens before its end


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    with LlamaServer(
        gguf(), binary=llama_server_binary(), threads=THREADS, extra_args=["--metrics"]
    ) as server:
        yield server


@pytest.fixture
def engines() -> Iterator[list[RemoteEngine]]:
    made: list[RemoteEngine] = []
    yield made
    for engine in made:
        engine.close()


def make(engines: list[RemoteEngine], url: str, api: str, **options) -> RemoteEngine:
    engine = RemoteEngine(EndpointConfig.create(url, api=api, **options))
    engines.append(engine)
    return engine


def metrics(server: LlamaServer) -> dict[str, float]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    pairs = (line.split() for line in lines if line[:1] != "#")
    return {name.removeprefix("llamacpp:"): float(value) for name, value in pairs}


def wait_idle(server: LlamaServer, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while (m := metrics(server))["requests_processing"] > 0:
        assert time.monotonic() < deadline, "llama-server is still generating"
        time.sleep(0.05)
    return m


@pytest.mark.parametrize("api", APIS)
def test_a_completion_to_the_line_end(llama, engines, api):
    engine = make(engines, llama.url, api)
    result = engine.complete(RemoteRequest(PROMPT, max_tokens=24, stop=("\n",)))
    assert result.error is None and result.text and "\n" not in result.text
    assert result.stop_reason in ("stop", "eos") and result.new_tokens > 0
    assert 0 < result.ttft_ms <= result.ttlt_ms
    if api == "llama.cpp":
        assert len(result.tokens) == result.new_tokens
    snap = engine.snapshot()
    assert (snap["status"], snap["requests"], snap["errors"]) == ("up", 1, 0)
    assert snap["ttft_ms"]["p50"] == result.ttft_ms


def test_both_apis_and_token_ids_give_the_same_greedy_text(llama, engines):
    native, openai = make(engines, llama.url, "llama.cpp"), make(engines, llama.url, "openai")
    request = RemoteRequest(PROMPT, max_tokens=12, stop=("\n",))
    texts = {native.complete(request).text, openai.complete(request).text}
    ids = native.tokenize(PROMPT)
    assert ids and openai.tokenize(PROMPT) == ids
    by_ids = RemoteRequest(ids, max_tokens=12, stop=("\n",))
    texts |= {native.complete(by_ids).text, openai.complete(by_ids).text}
    assert len(texts) == 1 and texts != {""}


@pytest.mark.parametrize("api", APIS)
def test_tokenize_uses_the_engines_tokenizer(llama, engines, api):
    engine = make(engines, llama.url, api)
    assert engine.tokenize("def foo") == [1604, 29856]  # SmolLM2: "def", " foo"; no BOS added
    assert engine.tokenize("") == []
    assert engine.detokenize([1604, 29856]) == "def foo" and engine.detokenize([29856]) == " foo"
    assert engine.snapshot()["tokenize"] == {"requests": 4, "failed": 0, "supported": True}


@pytest.mark.parametrize("api", APIS)
def test_token_healing_with_the_engines_tokenizer(llama, engines, api):
    engine = make(engines, llama.url, api)
    ids, shorter = engine.tokenize("import os\nimport sy"), engine.tokenize("import os\nimport")
    assert ids[: len(shorter)] == shorter and len(ids) == len(shorter) + 1  # the last token is " sy"
    healed = engine.complete(RemoteRequest(shorter, max_tokens=8, stop=("\n",), required_prefix=" sy"))
    assert healed.error is None and healed.stop_reason == "stop" and "\n" not in healed.text
    if engine.constrains_prefix:  # a grammar keeps llama.cpp to " sy...": "import sys"
        assert healed.prefix_met is True and healed.text == "s"
    else:  # checked only: unconstrained, this model's greedy choice after "import" strays
        assert healed.prefix_met is False and healed.text == ""
    # a healed line start holds the stop string itself: the stop applies only after it
    line_start = engine.complete(
        RemoteRequest(engine.tokenize("def f(x):"), max_tokens=12, stop=("\n",), required_prefix="\n    ")
    )
    if engine.constrains_prefix:
        assert line_start.prefix_met is True and line_start.text.strip()


def test_a_suffix_falls_back_to_the_prefix_on_a_model_without_fim(llama, engines):
    engine = make(engines, llama.url, "llama.cpp")
    result = engine.complete(RemoteRequest(PROMPT, suffix=")\n", max_tokens=8, stop=("\n",)))
    assert result.error is None and result.text and not result.used_suffix
    assert engine.snapshot()["fim_unsupported"] is True and engine.health.status == "up"


@pytest.mark.parametrize("api", APIS)
def test_a_cancel_stops_the_engines_generation(llama, engines, api):
    engine = make(engines, llama.url, api)
    before = wait_idle(llama)["tokens_predicted_total"]
    stop, pieces = threading.Event(), []

    def on_text(text: str) -> bool:
        pieces.append(text)
        if len(pieces) >= 3:
            stop.set()
        return False

    result = engine.complete(RemoteRequest(LONG, max_tokens=400), stop.is_set, on_text)
    assert result.stop_reason == "cancelled" and result.error is None and len(pieces) >= 3
    generated = wait_idle(llama)["tokens_predicted_total"] - before
    # uncancelled, greedy decoding of LONG runs ~150 tokens; the engine stops at its next chunk
    assert generated <= len(pieces) + 20, f"{generated} tokens generated after a cancel at {len(pieces)}"
    assert engine.health.status == "up" and engine.snapshot()["cancelled"] == 1


def test_the_time_budget_ends_the_request_without_an_outage(llama, engines):
    engine = make(engines, llama.url, "llama.cpp")
    started = time.monotonic()
    result = engine.complete(RemoteRequest(LONG, max_tokens=400, deadline=started + 0.3))
    assert result.stop_reason == "budget" and result.error is None
    assert time.monotonic() - started < 1.0
    wait_idle(llama)
    assert engine.health.status != "down"


def test_a_wrong_key_is_refused_with_one_notice_and_a_right_one_recovers(engines, monkeypatch):
    monkeypatch.setenv("LLAMA_TEST_KEY", "wrong-key")
    with LlamaServer(
        gguf(), binary=llama_server_binary(), threads=THREADS, extra_args=["--api-key", "right-key"]
    ) as server:
        engine = make(engines, server.url, "openai", api_key_env="LLAMA_TEST_KEY")
        refused = engine.complete(RemoteRequest(PROMPT, max_tokens=4))
        assert refused.error and "401" in refused.error and refused.text == ""
        assert engine.complete(RemoteRequest(PROMPT, max_tokens=4)).error  # backing off
        monkeypatch.setenv("LLAMA_TEST_KEY", "right-key")  # rotated: read at the next request
        time.sleep(FIRST_BACKOFF_S + 0.05)
        assert engine.complete(RemoteRequest(PROMPT, max_tokens=4)).error is None
        assert [n.kind for n in engine.health.take_notices()] == ["down", "recovered"]
        assert "right-key" not in str(engine.snapshot()) and "wrong-key" not in str(engine.snapshot())


def test_the_engine_killed_mid_stream_and_restarted(engines):
    server = LlamaServer(gguf(), binary=llama_server_binary(), threads=THREADS, port=free_port()).start()
    try:
        engine = make(engines, server.url, "llama.cpp")
        assert engine.complete(RemoteRequest(PROMPT, max_tokens=4)).error is None
        first = threading.Event()
        started = time.monotonic()

        def kill_once_streaming(text: str) -> bool:
            if not first.is_set():
                first.set()
                server.process.kill()
            return False

        broken = engine.complete(RemoteRequest(LONG, max_tokens=400), on_text=kill_once_streaming)
        assert first.is_set() and broken.error and time.monotonic() - started < 30
        server.stop()
        refused = engine.complete(RemoteRequest(PROMPT, max_tokens=4))
        assert refused.error and refused.text == ""
        for _ in range(5):  # backing off: answered at once, no notice per request
            assert engine.complete(RemoteRequest(PROMPT, max_tokens=4)).error
        server.start()  # the same port
        deadline = time.monotonic() + 30
        while (result := engine.complete(RemoteRequest(PROMPT, max_tokens=4))).error:
            assert time.monotonic() < deadline, result.error
            time.sleep(0.1)
        assert [n.kind for n in engine.health.take_notices()] == ["down", "recovered"]
        assert engine.snapshot()["outages"] == 1
    finally:
        server.stop()
