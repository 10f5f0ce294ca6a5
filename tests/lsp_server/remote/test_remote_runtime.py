"""The remote runtime's own rules, on what the real llama-server can't be made to show: an engine
without ``/tokenize`` (TGI, Ollama) and a ``/tokenize`` that stalls, stood in for by the small
loopback HTTP server of ``tests/support/fake_llama_server.py``; the typed-ahead chain as pure logic;
and a process that builds a remote runtime and a prompt without ever importing torch. The runtime
against the real engine is ``test_server_remote.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest, Prompt
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.remote.chains import Chain, Chains, typed_along
from speculative_complete.lsp_server.remote.remote_runtime import RemoteRuntime
from speculative_complete.lsp_server.remote.tokenizer import CHARS_PER_TOKEN, Calibration
from tests.support.fake_llama_server import Server, llama_events, sse

SOURCE = "import os\n\n\ndef main(argv):\n    path = os.path.join(argv[0], 'x')\n    return pa"
LINE = Ending()


def openai_events(*pieces: str) -> list[str]:
    events = [json.dumps({"choices": [{"text": p, "finish_reason": None}]}) for p in pieces]
    return [*events, json.dumps({"choices": [{"text": "", "finish_reason": "stop"}]}), "[DONE]"]


def not_found(h, body) -> None:
    h.send_response(404)
    h.send_header("Content-Length", "0")
    h.end_headers()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def runtimes() -> Iterator[list[RemoteRuntime]]:
    made: list[RemoteRuntime] = []
    yield made
    for runtime in made:
        runtime.close()


def connect(runtimes: list[RemoteRuntime], url: str, api: str = "openai") -> RemoteRuntime:
    runtime = RemoteRuntime.connect(Settings(endpoint=url, endpoint_api=api))
    runtimes.append(runtime)
    return runtime


def context(text: str = SOURCE, uri: str = "file:///m.py") -> ContextRequest:
    return ContextRequest(text=text, offset=len(text), budget_tokens=256, uri=uri, language_id="python")


def test_an_engine_without_tokenize_gets_character_budgets_and_unhealed_prompts(server, runtimes):
    def handle(h, body):
        if h.path.endswith("/tokenize"):
            not_found(h, body)
        else:
            sse(h, llama_events("th", "\n"))

    server.handler = handle
    runtime = connect(runtimes, server.url(), api="llama.cpp")  # llama.cpp would heal: if it could tokenize
    prompt = runtime.prompt(ContextBuilder(), context(), deadline=time.monotonic() + 2)
    assert prompt.ids is None and prompt.healed == "" and prompt.text.endswith("return pa")
    snap = runtime.snapshot()
    assert snap["prompts"]["tokenizer"] == "characters" and "no /tokenize" in snap["prompts"]["note"]
    assert snap["prompts"]["healing"] is False and snap["tokenize"]["supported"] is False
    result = runtime.generate(prompt, Settings(), LINE, lambda: False, cache_key="file:///m.py")
    assert result.text == "th" and result.stop_reason == "stop"
    completion = [s for s in server.seen if not s["path"].endswith("/tokenize")]
    sent = completion[-1]["body"]
    assert sent["prompt"] == prompt.text and sent["stop"] == ["\n"]  # text, unhealed, to the line end
    tokenize_asks = sum(s["path"].endswith("/tokenize") for s in server.seen)
    runtime.prompt(ContextBuilder(), context(SOURCE + "t"), deadline=time.monotonic() + 2)
    assert sum(s["path"].endswith("/tokenize") for s in server.seen) == tokenize_asks  # asked once only


def test_a_stalled_tokenize_gives_up_at_the_deadline_and_builds_by_characters(server, runtimes):
    runtime = connect(runtimes, server.url(), api="llama.cpp")  # the probe: answered like a llama.cpp
    stall = {"on": True}

    def handle(h, body):
        if h.path.endswith("/tokenize") and stall["on"]:
            server.release.wait(10)
        else:
            h.send_response(200)
            payload = json.dumps({"tokens": [1]}).encode()
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)

    server.handler = handle
    started = time.monotonic()
    prompt = runtime.prompt(ContextBuilder(), context(), deadline=started + 0.4)
    assert time.monotonic() - started < 2.0 and prompt.ids is None and prompt.healed == ""  # not the stall
    assert runtime.snapshot()["prompts"]["by_characters"] == 1


def test_a_block_is_cut_where_it_ends_and_the_stream_closed_there(server, runtimes):
    server.handler = lambda h, body: (
        not_found(h, body)
        if h.path.endswith("/tokenize")
        else sse(h, openai_events("\n        return 1", "\n    x = 2", "\n", "never"), pause_s=0.05)
    )
    runtime = connect(runtimes, server.url())
    ending = Ending(multiline=True, max_lines=5, body_indent=8, header_indent=4, from_header=True)
    prompt = Prompt(text="def f():\n    if x:", ids=None)
    result = runtime.generate(prompt, Settings(), ending, lambda: False)
    assert result.text == "\n        return 1" and result.stop_reason == "stop"
    assert runtime.engine.snapshot()["tokens"] < 4  # closed at the dedent, before "never"


def test_typed_along_needs_an_insertion_at_the_cursor_only():
    assert typed_along("ab|cd".replace("|", ""), 2, "abXYcd", 4) == "XY"
    assert typed_along("abcd", 2, "abXcd", 2) is None  # the cursor did not move on
    assert typed_along("abcd", 2, "aXbcd", 3) is None  # typed elsewhere
    assert typed_along("abcd", 2, "abXce", 3) is None  # and changed something after


def test_a_chain_answers_only_along_its_continuation_and_with_the_same_ending():
    chains = Chains()
    prompt = Prompt(text="x = ", healed="")
    chains.keep("u", Chain("x = ", "foo(bar)", LINE, "stop", "x = ", 4, prompt))
    assert chains.answer("u", Prompt(text="x = fo"), LINE)[0] == "o(bar)"
    assert chains.answer("u", Prompt(text="x = ", healed="f"), LINE)[0] == "oo(bar)"  # healed counts
    assert chains.answer("u", Prompt(text="x = fa"), LINE) is None
    assert chains.answer("u", Prompt(text="x = "), LINE) is None  # nothing typed: ask again
    assert chains.answer("u", Prompt(text="x = f"), Ending(multiline=True, max_lines=3)) is None
    along = chains.prompt_for("u", "x = fo", 6)
    assert along is not None and along.text == "x = fo" and chains.answer("u", along, LINE)[0] == "o(bar)"
    assert chains.prompt_for("u", "x = fa", 6) is None
    chains.forget("u")
    assert chains.answer("u", Prompt(text="x = fo"), LINE) is None


def test_a_remote_runtime_and_its_prompts_never_import_torch(server):
    server.handler = lambda h, body: not_found(h, body)
    script = textwrap.dedent(
        f"""
        import sys, time
        from speculative_complete.lsp_server.server import create_server
        from speculative_complete.lsp_server.config import from_cli
        from speculative_complete.lsp_server.model_host import load_engine_runtime
        from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest
        settings = from_cli(endpoint={server.url()!r}).settings
        create_server(from_cli(endpoint={server.url()!r}))
        runtime = load_engine_runtime(settings)
        request = ContextRequest(text="def f(x):\\n    return x", offset=20, budget_tokens=64)
        runtime.prompt(ContextBuilder(), request, time.monotonic() + 1)
        runtime.close()
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_character_estimate_is_calibrated_once_then_fixed():
    calibration = Calibration()
    assert calibration.ratio == CHARS_PER_TOKEN
    calibration.add("x" * 40, [1] * 40)  # too short to say anything
    assert calibration.ratio == CHARS_PER_TOKEN
    calibration.add("x" * 1000, [1] * 250)
    assert calibration.ratio == CHARS_PER_TOKEN  # under 256 tokens seen: not yet
    calibration.add("x" * 100, [1] * 10)
    fixed = calibration.ratio
    assert fixed == 1100 / 260
    calibration.add("y" * 1000, [1] * 1000)  # a later text changes nothing: the prompt's start stays put
    assert calibration.ratio == fixed
