"""The remote engine against faults a real engine can't be made to show on demand, served by a small
HTTP server on loopback (``tests/support/fake_llama_server.py``): 5xx, malformed JSON, a stalled
stream, a stream that ends without its final event, redirects (same host followed, another host
refused), TLS with and without the CA bundle, a DNS failure, a refused connection. Every call must
return (never raise, never outlive its deadline) with an empty result and an error; the API key must
never reach a log, the stats, a result or another host."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from speculative_complete.lsp_server.remote import EndpointConfig, RemoteEngine, RemoteRequest
from speculative_complete.lsp_server.remote.health import FIRST_BACKOFF_S
from tests.support.fake_llama_server import Handler, Server, llama_events, sse

LINE_END = RemoteRequest("def f(", max_tokens=8, stop=("\n",))


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def engines() -> Iterator[list[RemoteEngine]]:
    made: list[RemoteEngine] = []
    yield made
    for engine in made:
        engine.close()


def make(engines: list[RemoteEngine], url: str, **options) -> RemoteEngine:
    engine = RemoteEngine(EndpointConfig.create(url, **{"api": "llama.cpp", **options}))
    engines.append(engine)
    return engine


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    return call(), time.monotonic() - started


def test_a_stream_is_read_with_tokens_and_the_stop_reason(server, engines):
    server.handler = lambda h, body: sse(h, llama_events("a", "b", "c"))
    result = make(engines, server.url()).complete(LINE_END)
    assert (result.text, result.stop_reason, result.tokens, result.error) == ("abc", "stop", [0, 1, 2], None)
    assert server.seen[0]["path"] == "/completion" and server.seen[0]["body"]["stop"] == ["\n"]


@pytest.mark.parametrize("status", [500, 503])
def test_a_5xx_is_an_empty_answer_and_one_notice(server, engines, status):
    def fail(h, body):
        h.send_response(status)
        h.send_header("Content-Length", "9")
        h.end_headers()
        h.wfile.write(b"overload!")

    server.handler = fail
    engine = make(engines, server.url())
    first = engine.complete(LINE_END)
    assert first.text == "" and first.error and str(status) in first.error and "overload!" in first.error
    assert engine.health.status == "down" and len(server.seen) == 1
    again = engine.complete(LINE_END)  # backing off: answered without a request
    assert again.error and len(server.seen) == 1
    time.sleep(FIRST_BACKOFF_S + 0.05)
    server.handler = lambda h, body: sse(h, llama_events("ok"))
    assert engine.complete(LINE_END).text == "ok"
    assert [n.kind for n in engine.health.take_notices()] == ["down", "recovered"]
    snap = engine.snapshot()
    assert (snap["requests"], snap["errors"], snap["backed_off"], snap["status"]) == (3, 2, 1, "up")
    assert str(status) in snap["last_error"]


@pytest.mark.parametrize(
    "events",
    [["{not json"], ["[1, 2, 3]"], [json.dumps({"content": "a", "stop": False})]],
    ids=["malformed", "not-an-object", "no-final-event"],
)
def test_a_broken_stream_is_an_error_with_what_arrived(server, engines, events):
    server.handler = lambda h, body: sse(h, events)
    result = make(engines, server.url()).complete(LINE_END)
    assert result.error and result.stop_reason == "error"


def test_an_error_inside_the_stream(server, engines):
    server.handler = lambda h, body: sse(h, [json.dumps({"error": {"code": 500, "message": "slot died"}})])
    result = make(engines, server.url()).complete(LINE_END)
    assert result.error == "engine error: slot died"


def test_a_stalled_stream_ends_at_the_deadline_with_what_arrived(server, engines):
    def stall(h, body):
        sse(h, [json.dumps({"content": "par", "stop": False})])
        server.release.wait(10)

    server.handler = stall
    engine = make(engines, server.url())
    result, took = timed(
        lambda: engine.complete(RemoteRequest("x", max_tokens=8, deadline=time.monotonic() + 0.5))
    )
    assert result.text == "par" and result.stop_reason == "budget" and result.error is None
    assert 0.4 < took < 1.5
    # no answer at all before the deadline: empty, and one timeout alone is not an outage
    server.handler = lambda h, body: server.release.wait(10)
    result, took = timed(lambda: engine.complete(RemoteRequest("x", deadline=time.monotonic() + 0.3)))
    assert result.text == "" and result.stop_reason == "budget" and took < 1.5
    assert engine.health.status == "up"


def test_cancel_closes_the_stream_at_once(server, engines):
    closed = threading.Event()

    def slow(h, body):
        try:
            sse(h, [json.dumps({"content": "t", "stop": False})] * 200, pause_s=0.02)
        except (BrokenPipeError, ConnectionResetError):
            closed.set()
            raise

    server.handler = slow
    engine = make(engines, server.url())
    pieces: list[str] = []
    stop = threading.Event()

    def on_text(text: str) -> bool:
        pieces.append(text)
        if len(pieces) == 3:
            stop.set()
        return False

    result, took = timed(lambda: engine.complete(LINE_END, stop.is_set, on_text))
    assert result.stop_reason == "cancelled" and result.text.startswith("ttt") and took < 2
    assert closed.wait(3), "the server never saw the connection close"
    assert engine.snapshot()["cancelled"] == 1


def test_on_text_can_end_the_generation(server, engines):
    server.handler = lambda h, body: sse(h, llama_events("a", "b", "}", "c"), pause_s=0.01)
    result = make(engines, server.url()).complete(LINE_END, on_text=lambda text: text.endswith("}"))
    assert result.text == "ab}" and result.stop_reason == "stop"


def test_a_same_host_307_is_followed_and_another_host_refused(server, engines, monkeypatch):
    other = Server()
    try:

        def redirect(to: str) -> Handler:
            def answer(h, body):
                if h.path == "/completion":
                    h.send_response(307)
                    h.send_header("Location", to)
                    h.send_header("Content-Length", "0")
                    h.end_headers()
                else:
                    sse(h, llama_events("moved"))

            return answer

        server.handler = redirect("/completion2")
        monkeypatch.setenv("REMOTE_TEST_KEY", "sk-redirect-secret")
        engine = make(engines, server.url(), api_key_env="REMOTE_TEST_KEY")
        assert engine.complete(LINE_END).text == "moved"
        assert [s["path"] for s in server.seen] == ["/completion", "/completion2"]
        server.handler = redirect(other.url() + "/completion")
        result = engine.complete(LINE_END)
        assert result.error and "another host" in result.error and not other.seen
        time.sleep(FIRST_BACKOFF_S + 0.05)  # the refusal counts as a fault: wait out the backoff
        server.handler = redirect(other.url(host="localhost") + "/completion")
        assert "another host" in (engine.complete(LINE_END).error or "") and not other.seen
    finally:
        other.close()


def test_connection_refused_and_dns_failure_answer_at_once(engines, monkeypatch):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = make(engines, f"http://127.0.0.1:{port}")
    result, took = timed(lambda: engine.complete(LINE_END))
    assert result.error == "connection refused" and took < 2
    assert engine.health.status == "down" and engine.tokenize("x") is None
    # a name that does not resolve; the lookup is answered here, so no query leaves the machine
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "gpu-box.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    engine = make(engines, "https://gpu-box.invalid:8000")
    result, took = timed(lambda: engine.complete(LINE_END))
    assert result.error == "DNS lookup failed for the endpoint's host" and took < 2


def test_the_key_is_read_at_each_request_and_never_logged(server, engines, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the HTTP library's included
    monkeypatch.setenv("REMOTE_TEST_KEY", "sk-first-0123456789")
    engine = make(engines, server.url(), api_key_env="REMOTE_TEST_KEY")
    results = [engine.complete(LINE_END)]
    monkeypatch.setenv("REMOTE_TEST_KEY", "sk-rotated-9876543210")  # a rotated key works at once
    results.append(engine.complete(LINE_END))
    engine.tokenize("abc")

    def refuse(h, body):
        h.send_response(401)
        h.send_header("Content-Length", "40")
        h.end_headers()
        h.wfile.write(b'{"error": "Invalid API Key"}'.ljust(40))

    server.handler = refuse
    results.append(engine.complete(LINE_END))

    def echo(h, body):  # a proxy that quotes the request's headers in its error page
        page = f"bad gateway for {h.headers.get('Authorization')}".encode()
        h.send_response(502)
        h.send_header("Content-Length", str(len(page)))
        h.end_headers()
        h.wfile.write(page)

    server.handler = echo
    time.sleep(FIRST_BACKOFF_S + 0.05)
    results.append(engine.complete(LINE_END))
    assert "502" in results[-1].error and "(key not shown)" in results[-1].error
    auth = [s["headers"].get("Authorization") for s in server.seen]
    assert auth[:2] == ["Bearer sk-first-0123456789", "Bearer sk-rotated-9876543210"]
    assert results[2].error and "401" in results[2].error
    shown = caplog.text + json.dumps(engine.snapshot()) + repr(results) + repr(engine.config)
    shown += "".join(n.message for n in engine.health.take_notices())
    for key in ("sk-first-0123456789", "sk-rotated-9876543210"):
        assert key not in shown
    monkeypatch.delenv("REMOTE_TEST_KEY")
    server.handler = lambda h, body: sse(h, llama_events("x"))
    time.sleep(engine.health.backoff_s + 0.05)
    engine.complete(LINE_END)
    assert "Authorization" not in server.seen[-1]["headers"]  # no key: no header at all


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_is_verified_and_a_ca_bundle_makes_a_private_ca_work(engines, certificate):
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = Server(tls=context)
    try:
        untrusted = make(engines, server.url("https"))
        result = untrusted.complete(LINE_END)
        assert result.error and result.error.startswith("TLS failed") and not server.seen
        trusted = make(engines, server.url("https"), ca_bundle=str(cert))
        assert trusted.complete(LINE_END).text == "x"
        missing = make(engines, server.url("https"), ca_bundle=str(cert.parent / "missing.pem"))
        assert "caBundle" in (missing.complete(LINE_END).error or "")
    finally:
        server.close()


def test_one_kept_alive_connection_serves_consecutive_requests(server, engines):
    def tokens(h, body):
        data = json.dumps({"tokens": list(range(len(body["content"])))}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    server.handler, server.keep_alive = tokens, True
    engine = make(engines, server.url())
    assert [engine.tokenize("ab"), engine.tokenize("abc"), engine.tokenize("")] == [[0, 1], [0, 1, 2], []]
    assert len(server.seen) == 3 and len(server.peers) == 1


def test_tokenize_where_the_engine_has_none(server, engines):
    def missing(h, body):
        h.send_response(404)
        h.send_header("Content-Length", "0")
        h.end_headers()

    server.handler = missing
    engine = make(engines, server.url(), api="openai")
    assert engine.tokenize("x") is None and engine.tokenize("y") is None
    assert len(server.seen) == 1  # remembered: not asked again
    snap = engine.snapshot()
    assert snap["tokenize"]["supported"] is False and snap["status"] == "up"


def test_a_cancel_while_the_engine_has_not_answered_yet_returns_at_once(server, engines):
    server.handler = lambda h, body: server.release.wait(10)  # a long prefill: no byte yet
    engine = make(engines, server.url())
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    result, took = timed(lambda: engine.complete(LINE_END, stop.is_set))
    assert result.stop_reason == "cancelled" and result.error is None and took < 1.0
    assert engine.health.status != "down"


def test_a_closed_engine_answers_at_once(server):
    engine = RemoteEngine(EndpointConfig.create(server.url(), api="llama.cpp"))
    engine.close()
    result, took = timed(lambda: engine.complete(LINE_END))
    assert result.error == "the remote engine was closed" and took < 0.5
    assert engine.tokenize("x") is None and not server.seen


def test_done_without_a_finish_reason_is_a_clean_end(server, engines):
    chunk = json.dumps({"choices": [{"text": "ab", "finish_reason": None}]})
    server.handler = lambda h, body: sse(h, [chunk, "[DONE]"])
    result = make(engines, server.url(), api="openai").complete(LINE_END)
    assert (result.text, result.stop_reason, result.error) == ("ab", "stop", None)
