"""The HTTP side: one pooled client (keep-alive, HTTP/1.1) on a private event-loop thread.

Why a loop thread when callers are synchronous: a blocking read cannot be interrupted, so a
cancel or a passed deadline would wait for the engine's next byte (a whole prefill, or forever on
a stalled stream). On a loop, the caller's thread only waits on a queue with short timeouts, and
stopping is a task cancel that closes the connection at once; llama-server and vLLM abort the
generation when their client goes away.

Security: certificates are always verified (the system's store plus ``caBundle``); the
environment's proxies and .netrc are ignored (``trust_env=False``: the key goes to the endpoint and
nowhere else); a redirect is followed only to the same scheme, host and port, and only a 307/308
(which keep the method and body), never to another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import httpx2 as httpx

from speculative_complete.lsp_server.endpoint import EndpointConfig, parse_base_url

T = TypeVar("T")
CONNECT_TIMEOUT_S = 5.0
STALL_TIMEOUT_S = 30.0  # the longest wait for the next byte when the request has no deadline
MAX_REDIRECTS = 3
KEEPALIVE_S = 4.0
ERROR_BODY_CHARS = 300


class TransportError(Exception):
    """A failure with a message fit for the user and whether it means the engine is in trouble
    (``hard``) or only slow (a timeout)."""

    def __init__(self, message: str, hard: bool = True, status: int | None = None) -> None:
        super().__init__(message)
        self.hard, self.status = hard, status


def ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """The system's trust store, plus ``ca_bundle``'s certificates; verification always on."""
    context = ssl.create_default_context()
    if ca_bundle:
        try:
            context.load_verify_locations(cafile=ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"caBundle {ca_bundle!r} could not be read: {exc}") from None
    return context


class LoopThread:
    """An asyncio loop on a daemon thread, and the one ``httpx.AsyncClient`` that lives on it."""

    def __init__(self, config: EndpointConfig, name: str = "remote-engine") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._config = config
        self.client: httpx.AsyncClient | None = None
        self.setup_error: str | None = None
        self._closed = False
        try:
            self.run(self._open()).result(timeout=30)
        except Exception as exc:  # an unreadable caBundle, mostly: every request will say so
            self.setup_error = str(exc) if isinstance(exc, TransportError) else describe(exc).args[0]

    async def _open(self) -> None:
        # Servers drop idle connections after ~5 s (llama-server's and uvicorn's defaults); letting
        # ours go first keeps a request from landing on a connection the server is closing.
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S)
        self.client = httpx.AsyncClient(
            verify=ssl_context(self._config.ca_bundle),
            trust_env=False,
            follow_redirects=False,
            http1=True,
            http2=False,
            limits=limits,
        )

    @property
    def closed(self) -> bool:
        return self._closed or not self._thread.is_alive()

    def run(self, coroutine: Awaitable[T]) -> Future[T]:
        """Schedules ``coroutine`` on the loop thread; the future can be waited on or cancelled."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)  # type: ignore[arg-type]

    def close(self) -> None:
        """Cancels what is still streaming, closes the pool, then ends the loop thread."""
        self._closed = True
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.run(self._shutdown()).result(timeout=3)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=3)

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.client is not None:
            await self.client.aclose()
        await self.loop.shutdown_asyncgens()


def timeout_for(remaining_s: float | None) -> httpx.Timeout:
    """Bounded by the request's budget where it has one, so a stalled stream can't outlive it."""
    read = STALL_TIMEOUT_S if remaining_s is None else max(0.05, min(STALL_TIMEOUT_S, remaining_s + 0.5))
    connect = CONNECT_TIMEOUT_S if remaining_s is None else max(0.05, min(CONNECT_TIMEOUT_S, remaining_s))
    return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)


def without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` dropped: a refusal's message is logged, secrets never."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url


def same_origin_redirect(config: EndpointConfig, response: httpx.Response) -> str:
    """The URL to follow, or a TransportError saying why a redirect is refused."""
    location = response.headers.get("location", "")
    target = urljoin(str(response.request.url), location)
    try:
        url = parse_base_url(target.split("?", 1)[0])
    except ValueError:
        shown = without_credentials(location)[:100]
        raise TransportError(f"refused a redirect to an invalid URL {shown!r}") from None
    if url.origin != config.url.origin:
        shown = f"{urlsplit(target).scheme}://{urlsplit(target).netloc.rpartition('@')[2]}"
        raise TransportError(f"refused a redirect to another host ({shown})")
    if response.status_code not in (307, 308):
        raise TransportError(f"refused a {response.status_code} redirect (only 307/308 keep the request)")
    return target


async def open_stream(
    client: httpx.AsyncClient,
    config: EndpointConfig,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout: httpx.Timeout,
    stack: contextlib.AsyncExitStack,
) -> httpx.Response:
    """POST and return the streaming response once its status is 2xx (closed with ``stack``)."""
    for _ in range(MAX_REDIRECTS + 1):
        request = client.build_request("POST", url, json=body, headers=headers, timeout=timeout)
        try:
            response = await stack.enter_async_context(_send(client, request))
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            # a kept-alive connection the server closed as we sent: once more, on a new one
            request = client.build_request("POST", url, json=body, headers=headers, timeout=timeout)
            response = await stack.enter_async_context(_send(client, request))
        if response.is_redirect:
            url = same_origin_redirect(config, response)
            continue
        if response.status_code >= 400:
            await raise_for_status(response)
        return response
    raise TransportError(f"more than {MAX_REDIRECTS} redirects")


@contextlib.asynccontextmanager
async def _send(client: httpx.AsyncClient, request: httpx.Request):
    response = await client.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


async def raise_for_status(response: httpx.Response) -> None:
    """A 4xx/5xx as a TransportError with the start of the engine's own message."""
    try:
        raw = await response.aread()
        detail = raw[:2000].decode("utf-8", "replace")
    except httpx.HTTPError:
        detail = ""
    detail = " ".join(detail.split())[:ERROR_BODY_CHARS]
    status = response.status_code
    what = status_text(status)
    raise TransportError(f"{what}: {detail}" if detail else what, hard=True, status=status)


def status_text(status: int) -> str:
    """``HTTP 401 unauthorized (check the key in apiKeyEnv)`` and the like: what to do about it."""
    what = {
        401: "unauthorized (check the key in apiKeyEnv)",
        403: "forbidden (check the key in apiKeyEnv)",
        404: "not found (check endpoint and endpointApi)",
    }.get(status, "error")
    return f"HTTP {status} {what}"


def describe(exc: BaseException) -> TransportError:
    """Any failure of a request as a TransportError with a short message (never a header)."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, httpx.TimeoutException):
        connecting = isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout))
        phase = "connecting" if connecting else "waiting for data"
        return TransportError(f"timed out {phase}", hard=isinstance(exc, httpx.ConnectTimeout))
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        causes = list(_causes(exc))
        if any(isinstance(c, ssl.SSLError) for c in causes) or "certificate" in text.lower():
            return TransportError(f"TLS failed: {text[:200]}")
        if any(isinstance(c, socket.gaierror) for c in causes):
            return TransportError("DNS lookup failed for the endpoint's host")
        if any(isinstance(c, ConnectionRefusedError) for c in causes):
            return TransportError("connection refused")
        return TransportError(f"could not connect: {text[:200]}")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return TransportError(f"the connection broke mid-answer: {text[:200]}")
    if isinstance(exc, httpx.HTTPError):
        return TransportError(f"{type(exc).__name__}: {text[:200]}")
    return TransportError(f"unexpected {type(exc).__name__}: {text[:200]}")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it, through chained exceptions and exception groups (the connect
    path wraps the OS error: "All connection attempts failed")."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(getattr(current, "exceptions", ()))


def bearer(config: EndpointConfig) -> dict[str, str]:
    """Headers for one request; the key is read now and lives only in this request's headers."""
    key = config.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


Emit = Callable[[tuple], None]
