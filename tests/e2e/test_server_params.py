"""Requests whose params JSON-RPC lets a client leave out: absent, null and ``{}`` alike.

Neovim omits ``params`` when a plugin passes nil (``client:request('lsp_server/stats', nil)``);
pygls' generic message type required the field, so such a request got InvalidParams.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import lsp as h

INVALID_PARAMS, METHOD_NOT_FOUND = -32602, -32601
VARIANTS = ("absent", "null", "empty object")


def message(msg_id: int | None, method: str, variant: str) -> dict[str, Any]:
    """A request (or, with no id, a notification) whose params are ``variant``."""
    frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        frame["id"] = msg_id
    if variant != "absent":
        frame["params"] = None if variant == "null" else {}
    return frame


async def ask(server: h.RawServer, msg_id: int, method: str, variant: str) -> dict[str, Any]:
    server.send(message(msg_id, method, variant))
    return await server.response(msg_id)


@pytest.mark.parametrize("variant", VARIANTS)
async def test_methods_with_optional_params_accept_them_absent_null_or_empty(variant):
    server = await h.RawServer.start()
    try:
        await server.initialize()
        stats = await ask(server, 1, h.STATS, variant)
        assert stats["result"]["requests"] == 0, stats
        unknown = await ask(server, 2, "lsp_server/no_such_method", variant)
        assert unknown["error"]["code"] == METHOD_NOT_FOUND, unknown
        assert (await ask(server, 3, "shutdown", variant)) == {"jsonrpc": "2.0", "id": 3, "result": None}
        server.send(message(None, "exit", variant))
        assert await server.exit_code() == 0
    finally:
        await server.kill()


@pytest.mark.parametrize("arguments", ["absent", None, []])
async def test_a_command_called_without_its_arguments_is_invalid_params_not_a_server_error(arguments):
    server = await h.RawServer.start()
    try:
        await server.initialize()
        params: dict[str, Any] = {"command": "lsp_server.accepted"}
        if arguments != "absent":
            params["arguments"] = arguments
        answer = await server.request(1, "workspace/executeCommand", params)
        assert answer["error"]["code"] == INVALID_PARAMS, answer
        ok = await server.request(
            2, "workspace/executeCommand", {"command": "lsp_server.accepted", "arguments": [h.URI, "x = 1"]}
        )
        assert ok["result"] is None, ok
        assert (await server.request(3, h.STATS))["result"]["reuse"]["accepted"] == 1
    finally:
        await server.kill()
