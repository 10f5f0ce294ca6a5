"""A request's id on every log line emitted while serving it
(``speculative_complete/lsp_server/request_log.py``): the real server process at debug level, two
inline requests of known LSP ids on two documents, and the log file read afterwards.

Each request logs on the event loop (its answer: ``inline URI line:character -> ...``) and on the
decode worker thread (``inline URI: prompt of N characters built ...``, in ``_decode``); both
must say whose they are, and the two requests must not share an id.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import lsp as h

INLINE = "textDocument/inlineCompletion"
DOCUMENTS = {41: "file:///work/first.py", 42: "file:///work/second.py"}  # LSP request id -> document
TEXT = "def greet(name):\n    message = "
# ``LOG_FORMAT``: time, level, logger, then the request's stamp where there is one.
LINE = re.compile(
    r"^\S+ \S+ DEBUG speculative_complete\.lsp_server\.completion"
    r"(?P<stamp> \[request [^\]]+\])?: (?P<message>.*)$"
)


def inline(uri: str) -> dict:
    return {
        "textDocument": {"uri": uri},
        "position": {"line": 1, "character": len("    message = ")},
        "context": {"triggerKind": 1},
    }


def completion_lines(log: Path, uri: str) -> dict[str, str | None]:
    """The completion module's debug lines about ``uri``: 'worker' (the prompt built) and 'loop'
    (the answer), each with its request stamp (None: unstamped)."""
    found: dict[str, str | None] = {}
    for line in log.read_text().splitlines():
        match = LINE.match(line)
        if match is None or not match["message"].startswith(f"inline {uri}"):
            continue
        where = "worker" if ": prompt of " in match["message"] else "loop"
        found[where] = match["stamp"]
    return found


async def test_each_requests_log_lines_carry_its_id_on_the_loop_and_on_the_worker(tmp_path):
    log = tmp_path / "server.log"
    server = await h.RawServer.start("--log-level", "debug", "--log-file", str(log))
    try:
        await server.initialize({"workspaceIndexMb": 0})
        await server.wait_model()
        for uri in DOCUMENTS.values():
            server.notify(
                "textDocument/didOpen",
                {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": TEXT}},
            )
        for request_id, uri in DOCUMENTS.items():
            assert "result" in await server.request(request_id, INLINE, inline(uri))
        await server.request(99, "shutdown")
        server.notify("exit")
        assert await server.exit_code() == 0
    finally:
        await server.kill()
    for request_id, uri in DOCUMENTS.items():
        stamp = f" [request {request_id}]"
        assert completion_lines(log, uri) == {"worker": stamp, "loop": stamp}, log.read_text()[-3000:]
