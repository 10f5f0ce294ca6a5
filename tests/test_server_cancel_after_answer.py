"""A $/cancelRequest that crosses its request's answer on the wire (editors cancel at every
keystroke) is ignored quietly, as LSP says: no warning, which Neovim would log as an error."""

from __future__ import annotations

from tests import lsp_helpers as h

INLINE = "textDocument/inlineCompletion"


async def test_a_cancel_for_an_answered_request_is_ignored_without_a_warning(tmp_path):
    log_file = tmp_path / "server.log"
    server = await h.RawServer.start("--log-level", "warning", "--log-file", str(log_file))
    try:
        await server.initialize()
        await server.wait_model()
        server.notify("textDocument/didOpen", {"textDocument": {
            "uri": h.URI, "languageId": "python", "version": 1, "text": "print('hi')"}})
        params = {"textDocument": {"uri": h.URI}, "position": {"line": 0, "character": 11},
                  "context": {"triggerKind": 1}}
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
