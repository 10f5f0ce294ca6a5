"""Messages that cross on the wire are routine with real editors and must stay quiet: a
$/cancelRequest for a request already answered (editors cancel at every keystroke), and a response
to a server request the server stopped waiting for (a client busy at a prompt). pygls warned about
the first and showed the user an "Error in server" message for the second."""

from __future__ import annotations

import asyncio

from speculative_complete.lsp_server.lifecycle import CREATE_TIMEOUT_S
from tests.support import lsp as h

INLINE = "textDocument/inlineCompletion"


async def test_a_cancel_for_an_answered_request_is_ignored_without_a_warning(tmp_path):
    log_file = tmp_path / "server.log"
    server = await h.RawServer.start("--log-level", "warning", "--log-file", str(log_file))
    try:
        await server.initialize()
        await server.wait_model()
        server.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": h.URI, "languageId": "python", "version": 1, "text": "print('hi')"}},
        )
        params = {
            "textDocument": {"uri": h.URI},
            "position": {"line": 0, "character": 11},
            "context": {"triggerKind": 1},
        }
        assert "result" in await server.request(3, INLINE, params)
        server.notify("$/cancelRequest", {"id": 3})  # too late: answered already
        stats = (await server.request(4, h.STATS))["result"]  # handled after the cancel
        assert stats["cancelled"] == 0 and stats["answered"] == stats["requests"] == 1
        await server.request(5, "shutdown")
        server.notify("exit")
        assert await server.exit_code() == 0
        assert log_file.read_text() == ""
    finally:
        await server.kill()


async def test_a_response_after_the_server_stopped_waiting_is_dropped_quietly(tmp_path):
    log_file = tmp_path / "server.log"
    server = await h.RawServer.start("--log-level", "error", "--log-file", str(log_file))
    try:
        server.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "processId": None,
                    "rootUri": None,
                    "capabilities": {"window": {"workDoneProgress": True}},
                },
            }
        )
        assert "result" in await server.receive()
        server.notify("initialized", {})
        create = await server.receive()
        assert create["method"] == "window/workDoneProgress/create"
        # No answer: after CREATE_TIMEOUT_S the server loads without a progress bar and says so.
        while True:
            message = await asyncio.wait_for(server.receive(), CREATE_TIMEOUT_S + h.ANSWER_TIMEOUT_S)
            if "loading model" in message.get("params", {}).get("message", ""):
                break
        server.send({"jsonrpc": "2.0", "id": create["id"], "result": None})  # the late answer
        assert (await server.wait_model())["model"]["loaded"]
        shown = [n for n in server.notifications if n["method"] == "window/showMessage"]
        assert shown == []
        await server.request(5, "shutdown")
        server.notify("exit")
        assert await server.exit_code() == 0
        assert log_file.read_text() == ""
    finally:
        await server.kill()
