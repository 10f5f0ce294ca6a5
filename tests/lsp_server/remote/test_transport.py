"""``speculative_complete.lsp_server.remote.transport``: the pooled HTTP client on its loop thread,
against real servers on loopback: streams, redirects, error statuses, timeouts, refused and broken
connections, TLS, cancellation; and the pure parts (timeouts, messages, redirect rules) on their
own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest

from speculative_complete.lsp_server.endpoint import EndpointConfig
from speculative_complete.lsp_server.remote import transport
from speculative_complete.lsp_server.remote.transport import LoopThread, TransportError
from tests.support.fake_llama_server import sse
from tests.support.remote_server import (
    HttpServer,
    RawServer,
    answer,
    read_request,
    self_signed_certificate,
)

BODY = {"prompt": "def f(", "n_predict": 8}


@pytest.fixture
def server() -> Iterator[HttpServer]:
    s = HttpServer()
    yield s
    s.close()


@pytest.fixture
def raw_servers() -> Iterator[list[RawServer]]:
    made: list[RawServer] = []
    yield made
    for s in made:
        s.close()


@dataclass
class Client:
    """An endpoint's config and the loop thread built from it, as the remote engine holds them."""

    config: EndpointConfig
    loop: LoopThread

    async def open(
        self, path: str, stack: contextlib.AsyncExitStack, remaining_s: float | None = 5.0, headers=None
    ) -> httpx.Response:
        """``open_stream`` of a POST of ``BODY`` to ``path``, on the loop thread."""
        assert self.loop.client is not None
        url, timeout = self.config.url.text + path, transport.timeout_for(remaining_s)
        return await transport.open_stream(
            self.loop.client, self.config, url, BODY, headers or {}, timeout, stack
        )

    def post(self, path: str, remaining_s: float | None = 5.0, headers=None) -> tuple[int, str]:
        """The status and the whole body of a POST to ``path``."""

        async def call() -> tuple[int, str]:
            async with contextlib.AsyncExitStack() as stack:
                response = await self.open(path, stack, remaining_s, headers)
                return response.status_code, (await response.aread()).decode()

        return self.loop.run(call()).result(timeout=10)

    def failure(self, path: str, remaining_s: float | None = 5.0) -> TransportError:
        """What a POST to ``path`` fails with, as the remote engine turns it into a TransportError."""
        with pytest.raises(Exception) as caught:
            self.post(path, remaining_s)
        return transport.describe(caught.value)


@pytest.fixture
def connect() -> Iterator[Callable[..., Client]]:
    made: list[LoopThread] = []

    def client(url: str, **options) -> Client:
        config = EndpointConfig.create(url, **options)
        made.append(LoopThread(config))
        return Client(config, made[-1])

    yield client
    for loop in made:
        loop.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


# -- ssl_context ------------------------------------------------------------------------------------


def test_the_ssl_context_always_verifies():
    context = transport.ssl_context(None)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is True


def test_a_ca_bundle_adds_its_certificate(certificate):
    cert, _ = certificate
    before = transport.ssl_context(None).cert_store_stats()["x509"]
    assert transport.ssl_context(str(cert)).cert_store_stats()["x509"] == before + 1


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_an_unreadable_ca_bundle_is_a_transport_error_naming_it(tmp_path, content):
    bundle = tmp_path / "bundle.pem"
    if content is not None:
        bundle.write_text(content)
    with pytest.raises(TransportError) as caught:
        transport.ssl_context(str(bundle))
    assert str(caught.value).startswith(f"caBundle {str(bundle)!r} could not be read: ")
    assert caught.value.hard is True


# -- timeout_for --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remaining", "connect", "read"),
    [
        (None, transport.CONNECT_TIMEOUT_S, transport.STALL_TIMEOUT_S),  # no deadline
        (100.0, transport.CONNECT_TIMEOUT_S, transport.STALL_TIMEOUT_S),  # a far one: the caps
        (2.0, 2.0, 2.5),  # the budget, and half a second for the answer in flight
        (0.0, 0.05, 0.5),
        (-3.0, 0.05, 0.05),  # already past: the floor
    ],
)
def test_timeouts_follow_the_request_budget(remaining, connect, read):
    timeout = transport.timeout_for(remaining)
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (connect, read, read, connect)


# -- status_text and bearer -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (401, "HTTP 401 unauthorized (check the key in apiKeyEnv)"),
        (403, "HTTP 403 forbidden (check the key in apiKeyEnv)"),
        (404, "HTTP 404 not found (check endpoint and endpointApi)"),
        (500, "HTTP 500 error"),
        (429, "HTTP 429 error"),
    ],
)
def test_status_text_says_what_to_check(status, text):
    assert transport.status_text(status) == text


def test_bearer_reads_the_key_at_each_call(monkeypatch):
    config = EndpointConfig.create("http://127.0.0.1:1", api_key_env="TRANSPORT_TEST_KEY")
    monkeypatch.delenv("TRANSPORT_TEST_KEY", raising=False)
    assert transport.bearer(config) == {}
    monkeypatch.setenv("TRANSPORT_TEST_KEY", "sk-one")
    assert transport.bearer(config) == {"Authorization": "Bearer sk-one"}
    monkeypatch.setenv("TRANSPORT_TEST_KEY", "")
    assert transport.bearer(config) == {}
    assert transport.bearer(EndpointConfig.create("http://127.0.0.1:1")) == {}  # no variable named


# -- same_origin_redirect -------------------------------------------------------------------------------


def redirect(
    status: int, location: str, sent_to: str = "https://gpu-box:8000/v1/completions"
) -> httpx.Response:
    return httpx.Response(status, headers={"location": location}, request=httpx.Request("POST", sent_to))


CONFIG = EndpointConfig.create("https://gpu-box:8000/v1")


@pytest.mark.parametrize(
    ("status", "location", "target"),
    [
        (307, "https://gpu-box:8000/v2/completions", "https://gpu-box:8000/v2/completions"),
        (308, "/v2/completions?x=1", "https://gpu-box:8000/v2/completions?x=1"),  # relative
        (307, "completions2", "https://gpu-box:8000/v1/completions2"),
        (307, "https://GPU-BOX:8000/v2", "https://GPU-BOX:8000/v2"),  # host names ignore case
    ],
)
def test_a_307_or_308_to_the_same_origin_is_followed(status, location, target):
    assert transport.same_origin_redirect(CONFIG, redirect(status, location)) == target


def test_the_default_port_is_the_same_origin():
    config = EndpointConfig.create("https://gpu-box/v1")
    response = redirect(307, "https://gpu-box:443/v2", "https://gpu-box/v1/completions")
    assert transport.same_origin_redirect(config, response) == "https://gpu-box:443/v2"


@pytest.mark.parametrize(
    ("status", "location", "message"),
    [
        (307, "https://evil.example/steal", "refused a redirect to another host (https://evil.example)"),
        (307, "https://gpu-box:8001/v1", "refused a redirect to another host (https://gpu-box:8001)"),
        (307, "http://gpu-box:8000/v1", "refused a redirect to another host (http://gpu-box:8000)"),
        (302, "/v2/completions", "refused a 302 redirect (only 307/308 keep the request)"),
        (301, "https://gpu-box:8000/v2", "refused a 301 redirect (only 307/308 keep the request)"),
        (307, "ftp://gpu-box/x", "refused a redirect to an invalid URL 'ftp://gpu-box/x'"),
    ],
)
def test_other_redirects_are_refused_saying_why(status, location, message):
    with pytest.raises(TransportError) as caught:
        transport.same_origin_redirect(CONFIG, redirect(status, location))
    assert str(caught.value) == message


def test_a_redirect_to_a_url_with_a_user_is_refused_without_showing_the_password():
    with pytest.raises(TransportError) as caught:
        transport.same_origin_redirect(CONFIG, redirect(307, "https://user:s3cret@gpu-box:8000/v1"))
    assert str(caught.value) == "refused a redirect to an invalid URL 'https://gpu-box:8000/v1'"
    assert "s3cret" not in str(caught.value) and "user" not in str(caught.value)


# -- describe --------------------------------------------------------------------------------------------


def connect_error(cause: BaseException, text: str = "All connection attempts failed") -> httpx.ConnectError:
    try:
        raise httpx.ConnectError(text) from cause
    except httpx.ConnectError as exc:
        return exc


@pytest.mark.parametrize(
    ("error", "message", "hard"),
    [
        (httpx.ConnectTimeout("t"), "timed out connecting", True),
        (httpx.PoolTimeout("t"), "timed out connecting", False),
        (httpx.ReadTimeout("t"), "timed out waiting for data", False),
        (httpx.WriteTimeout("t"), "timed out waiting for data", False),
        (
            connect_error(socket.gaierror(-2, "Name or service not known")),
            "DNS lookup failed for the endpoint's host",
            True,
        ),
        (
            connect_error(ExceptionGroup("many", [OSError("x"), ConnectionRefusedError(111, "no")])),
            "connection refused",
            True,
        ),
        (
            connect_error(ssl.SSLCertVerificationError(1, "bad")),
            "TLS failed: All connection attempts failed",
            True,
        ),
        (connect_error(OSError("unreachable")), "could not connect: All connection attempts failed", True),
        (httpx.RemoteProtocolError("peer closed"), "the connection broke mid-answer: peer closed", True),
        (httpx.ReadError(""), "the connection broke mid-answer: ReadError", True),
        (httpx.DecodingError("bad gzip"), "DecodingError: bad gzip", True),
        (ValueError("x" * 500), "unexpected ValueError: " + "x" * 200, True),
    ],
)
def test_describe_gives_a_short_message_and_whether_the_engine_is_in_trouble(error, message, hard):
    described = transport.describe(error)
    assert (str(described), described.hard, described.status) == (message, hard, None)


def test_describe_passes_a_transport_error_through():
    error = TransportError("HTTP 500 error", hard=True, status=500)
    assert transport.describe(error) is error


def test_describe_survives_a_cycle_of_causes():
    first, second = OSError("a"), OSError("b")
    first.__context__, second.__context__ = second, first
    assert (
        str(transport.describe(connect_error(first))) == "could not connect: All connection attempts failed"
    )


# -- LoopThread ---------------------------------------------------------------------------------------------


def test_the_loop_thread_runs_coroutines_on_its_own_thread_and_closes(server):
    loop = LoopThread(EndpointConfig.create(server.url()), name="transport-test-loop")
    try:
        assert loop.setup_error is None and loop.client is not None and not loop.closed

        async def where() -> str:
            return threading.current_thread().name

        assert loop.run(where()).result(timeout=5) == "transport-test-loop"
    finally:
        loop.close()
    assert loop.closed
    assert "transport-test-loop" not in [thread.name for thread in threading.enumerate()]
    loop.close()  # twice is harmless


def test_closing_cancels_what_is_still_running(server, connect):
    loop = connect(server.url()).loop
    pending = loop.run(asyncio.sleep(60))
    started = time.monotonic()
    loop.close()
    assert pending.cancelled() and time.monotonic() - started < 3


def test_an_unreadable_ca_bundle_is_kept_as_the_setup_error(tmp_path, connect):
    loop = connect("https://gpu-box:8000", ca_bundle=str(tmp_path / "missing.pem")).loop
    assert loop.client is None
    assert loop.setup_error is not None and loop.setup_error.startswith("caBundle ")


def test_the_environments_proxies_are_ignored(server, connect, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert connect(server.url()).post("/completion") == (200, "{}")


# -- open_stream -----------------------------------------------------------------------------------------


def test_a_stream_is_posted_and_read(server, connect):
    server.handler = lambda h, body: sse(h, ['{"content": "a"}', '{"content": "é"}'])
    status, text = connect(server.url()).post("/completion", headers={"Authorization": "Bearer k"})
    assert (status, text) == (200, 'data: {"content": "a"}\n\ndata: {"content": "é"}\n\n')
    (seen,) = server.seen
    assert (seen["path"], seen["body"], seen["headers"]["Authorization"]) == ("/completion", BODY, "Bearer k")


@pytest.mark.parametrize("status", [307, 308])
def test_a_same_origin_redirect_is_followed_with_the_same_post(server, connect, status):
    def handler(h, body):
        if h.path == "/old":
            answer(h, status, Location="/new")
        else:
            answer(h, 200, b"moved")

    server.handler = handler
    assert connect(server.url()).post("/old") == (200, "moved")
    assert [(s["path"], s["body"]) for s in server.seen] == [("/old", BODY), ("/new", BODY)]


def test_a_redirect_to_another_host_is_refused_before_anything_is_sent_there(server, connect):
    other = HttpServer()
    try:
        server.handler = lambda h, body: answer(h, 307, Location=other.url(host="localhost") + "/x")
        error = connect(server.url()).failure("/completion")
        assert str(error) == f"refused a redirect to another host (http://localhost:{other.port})"
        assert other.seen == []
    finally:
        other.close()


def test_a_redirect_loop_ends_after_max_redirects(server, connect):
    server.handler = lambda h, body: answer(h, 307, Location="/again")
    error = connect(server.url()).failure("/completion")
    assert str(error) == f"more than {transport.MAX_REDIRECTS} redirects"
    assert len(server.seen) == transport.MAX_REDIRECTS + 1


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (
            404,
            b'{"error":\n  "no such route"}',
            'HTTP 404 not found (check endpoint and endpointApi): {"error": "no such route"}',
        ),
        (500, b"", "HTTP 500 error"),
        (503, b"   \n ", "HTTP 503 error"),
        (401, "é".encode() * 1500, "HTTP 401 unauthorized (check the key in apiKeyEnv): " + "é" * 300),
    ],
)
def test_an_error_status_carries_the_start_of_the_engines_message(server, connect, status, body, message):
    server.handler = lambda h, _: answer(h, status, body)
    error = connect(server.url()).failure("/completion")
    assert (str(error), error.status, error.hard) == (message, status, True)


def raw_server(serve: Callable[[socket.socket, int], None], raw_servers: list[RawServer]) -> RawServer:
    raw_servers.append(RawServer(serve))
    return raw_servers[-1]


def test_a_kept_alive_connection_dropped_by_the_server_is_retried_once_on_a_new_one(raw_servers, connect):
    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        if index == 0:  # answer the first request, then drop the connection at the next one
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nfirst")
            read_request(conn)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecond")

    server = raw_server(serve, raw_servers)
    client = connect(server.url())
    assert client.post("/completion") == (200, "first")
    assert client.post("/completion") == (200, "second")
    assert server.connections == 2


def test_only_one_retry_then_the_broken_connection_is_the_error(raw_servers, connect):
    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)  # and close without a word

    server = raw_server(serve, raw_servers)
    error = connect(server.url()).failure("/completion")
    assert str(error).startswith("the connection broke mid-answer: ") and error.hard
    assert server.connections == 2


def test_a_malformed_answer_is_a_broken_connection(raw_servers, connect):
    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b"SURPRISE this is not HTTP\r\n\r\n")

    server = raw_server(serve, raw_servers)
    error = connect(server.url()).failure("/completion")
    assert str(error).startswith("the connection broke mid-answer: ")


def test_a_body_cut_short_breaks_the_read_not_the_open(raw_servers, connect):
    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")

    client = connect(raw_server(serve, raw_servers).url())
    opened: list[int] = []

    async def call() -> None:
        async with contextlib.AsyncExitStack() as stack:
            response = await client.open("/completion", stack)
            opened.append(response.status_code)
            await response.aread()

    with pytest.raises(httpx.RemoteProtocolError) as caught:
        client.loop.run(call()).result(timeout=10)
    assert opened == [200]
    assert str(transport.describe(caught.value)).startswith("the connection broke mid-answer: ")


def test_a_server_that_never_answers_times_out_within_the_budget(raw_servers, connect):
    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        server.release.wait(10)

    server = raw_server(serve, raw_servers)
    client = connect(server.url())
    started = time.monotonic()
    error = client.failure("/completion", remaining_s=0.2)
    took = time.monotonic() - started
    assert (str(error), error.hard) == ("timed out waiting for data", False)
    assert 0.6 <= took < 2.0  # the budget and half a second for the answer in flight


def test_a_refused_connection_answers_at_once(connect):
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = connect(f"http://127.0.0.1:{port}")
    started = time.monotonic()
    error = client.failure("/completion")
    assert (str(error), error.hard) == ("connection refused", True) and time.monotonic() - started < 2


def test_a_name_that_does_not_resolve_is_a_dns_failure(connect, monkeypatch):
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):  # answered here: no query leaves the machine
        if host == "gpu-box.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    error = connect("https://gpu-box.invalid:8000").failure("/completion")
    assert str(error) == "DNS lookup failed for the endpoint's host"


def test_tls_is_verified_and_the_ca_bundle_makes_a_private_ca_work(certificate, connect):
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = HttpServer(tls=context)
    try:
        error = connect(server.url("https")).failure("/completion")
        assert str(error).startswith("TLS failed: ") and "CERTIFICATE_VERIFY_FAILED" in str(error)
        assert server.seen == []
        assert connect(server.url("https"), ca_bundle=str(cert)).post("/completion") == (200, "{}")
    finally:
        server.close()


def test_cancelling_a_stream_closes_its_connection_at_once(raw_servers, connect):
    closed = threading.Event()

    def serve(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {}\n\n")
        conn.settimeout(10)
        if conn.recv(1) == b"":  # the client hung up
            closed.set()

    client = connect(raw_server(serve, raw_servers).url())
    first_line = threading.Event()

    async def follow() -> None:
        async with contextlib.AsyncExitStack() as stack:
            response = await client.open("/completion", stack, remaining_s=None)
            async for _ in response.aiter_lines():
                first_line.set()

    future = client.loop.run(follow())
    assert first_line.wait(5)
    cancelled_at = time.monotonic()
    future.cancel()
    assert closed.wait(2) and time.monotonic() - cancelled_at < 1
    assert future.cancelled()
