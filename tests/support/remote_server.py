"""Small HTTP servers on loopback for the remote engine's tests: faults a real engine can't be
made to show on demand.

- ``HttpServer``: the fake llama-server's threading HTTP/1.1 server (it records every request,
  optionally speaks TLS) with a plain ``{}`` answer until a test sets ``handler``.
- ``RawServer``: a TCP server that hands each connection to ``on_connection``, for answers no HTTP
  server would send (garbage, a body cut short, a kept-alive connection dropped mid-request).
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from tests.support.fake_llama_server import Server


def answer(
    handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes = b"", **headers: str
) -> None:
    """A complete answer with a length, so the connection may be kept alive."""
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class HttpServer(Server):
    """The fake llama-server's HTTP server (``fake_llama_server.Server``), answering ``{}`` until a
    test sets its ``handler``."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls)
        self.handler = lambda h, body: answer(h, 200, b"{}")


class RawServer:
    """Accepts TCP connections on loopback and runs ``on_connection(socket, index)`` for each on a
    thread of its own (``index`` counts connections from 0); the socket is closed afterwards."""

    def __init__(self, on_connection: Callable[[socket.socket, int], None]) -> None:
        self.on_connection = on_connection
        self.connections = 0
        self.release = threading.Event()  # ends stalls at teardown
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            index, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._handle, args=(conn, index), daemon=True).start()

    def _handle(self, conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            self.on_connection(conn, index)

    def close(self) -> None:
        self.release.set()
        self._stopped.set()
        self._listener.close()


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request's head and body off ``conn`` (by its Content-Length); b"" when the peer
    closed the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its key, made by ``openssl``."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key
