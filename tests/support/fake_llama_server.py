"""A small HTTP server on loopback that answers as llama-server's streaming API does, with
answers a test chooses: faults a real engine cannot be made to show on demand."""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import threading
import time
from collections.abc import Callable

Handler = Callable[[http.server.BaseHTTPRequestHandler, dict], None]


def sse(handler: http.server.BaseHTTPRequestHandler, events: list[str], pause_s: float = 0.0) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for event in events:
        handler.wfile.write(f"data: {event}\n\n".encode())
        handler.wfile.flush()
        time.sleep(pause_s)


def llama_events(*pieces: str) -> list[str]:
    return [json.dumps({"content": p, "tokens": [i], "stop": False}) for i, p in enumerate(pieces)] + [
        json.dumps({"content": "", "stop": True, "stop_type": "word", "tokens_predicted": len(pieces)})
    ]


class Server:
    """A ThreadingHTTPServer whose POST answers come from ``self.handler``; records each request."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        outer = self
        self.handler: Handler = lambda h, body: sse(h, llama_events("x"))
        self.seen: list[dict] = []
        self.peers: set[tuple] = set()  # client (host, port)s: one per connection
        self.keep_alive = False  # a stream without a length must close its connection
        self.release = threading.Event()  # ends stalls at teardown

        class Handle(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                outer.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                outer.peers.add(self.client_address)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    outer.handler(self, body)
                self.close_connection = not outer.keep_alive

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
