"""Frames a client should never send: the server drops each one and reads the next as sent.

The soak found the case that broke this: a Content-Length shorter than the body left the rest of
the body in front of the next frame's header, and from then on no frame was ever read again.
"""

from __future__ import annotations

import json

import pytest

from tests.support import lsp as h


def stats_frame(msg_id: int, length_delta: int = 0) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": h.STATS}).encode()
    return b"Content-Length: %d\r\n\r\n" % (len(body) + length_delta) + body


BAD = dict(
    [
        ("Content-Length too short", stats_frame(90, -7)),
        ("Content-Length too long, junk after", stats_frame(91, 12) + b"x" * 12),
        ("truncated body", b"Content-Length: 20\r\n\r\n" + stats_frame(92)[-20:]),
        ("not JSON", b"Content-Length: 9\r\n\r\nnot JSON!"),
        ("not UTF-8", b"Content-Length: 4\r\n\r\n\xff\xfe\xfd\xfc"),
        ("JSON that is not a message", b"Content-Length: 6\r\n\r\n[1, 2]"),
    ]
)


@pytest.mark.parametrize("label", list(BAD))
async def test_after_a_bad_frame_the_next_one_is_read_and_answered(label):
    bad = BAD[label]
    server = await h.RawServer.start()
    try:
        await server.initialize()
        for attempt in range(3):  # several in a row: each must leave the stream at a frame boundary
            server.process.stdin.write(bad)
            server.process.stdin.write(stats_frame(100 + attempt))
            answer = await server.response(100 + attempt)
            assert answer["result"]["requests"] == 0, (label, answer)
    finally:
        await server.kill()


async def test_a_notification_with_bad_params_is_dropped_without_an_error_message_to_the_user():
    server = await h.RawServer.start()
    try:
        await server.initialize()
        server.notify("$/cancelRequest", {"id": [1]})
        server.notify("textDocument/didOpen", None)
        server.notify("textDocument/didChange", {"textDocument": {"uri": h.URI}})
        answer = await server.request(1, h.STATS)
        assert answer["result"]["requests"] == 0
        shown = [n for n in server.notifications if n["method"] == "window/showMessage"]
        assert shown == []
    finally:
        await server.kill()
