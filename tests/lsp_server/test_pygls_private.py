"""The pygls private members ``speculative_complete/lsp_server/protocol.py`` relies on, checked
against the installed pygls: if an upgrade moves or renames one, this fails with its name instead of
the server misbehaving at run time (an unanswered request, a crash on the first document)."""

from __future__ import annotations

import inspect

import pytest
from pygls.lsp.server import LanguageServer
from pygls.protocol import JsonRPCProtocol, LanguageServerProtocol
from pygls.workspace import Workspace

from speculative_complete.lsp_server.protocol import CompletionProtocol, LspWorkspace, use_lsp_line_model


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("_send_response", ["self", "msg_id", "result", "error"]),
        ("_handle_cancel_notification", ["self", "msg_id"]),
        ("_handle_response", ["self", "msg_id", "result", "error"]),
        ("structure_message", ["self", "data"]),
        ("handle_message", ["self", "message"]),
    ],
)
def test_the_protocol_methods_overridden_or_called_exist_with_these_parameters(name, expected):
    assert parameters(getattr(JsonRPCProtocol, name)) == expected


def test_the_protocol_and_server_attributes_read_exist():
    server = LanguageServer(name="probe", version="0", protocol_cls=CompletionProtocol)
    protocol = server.protocol
    assert isinstance(protocol, LanguageServerProtocol)
    assert isinstance(protocol._request_futures, dict)
    assert protocol._shutdown is False
    assert hasattr(protocol, "_workspace")
    assert hasattr(server, "_stop_event")


def test_the_workspace_creates_documents_through_the_overridden_method():
    assert parameters(Workspace._create_text_document) == [
        "self",
        "doc_uri",
        "source",
        "version",
        "language_id",
    ]
    workspace = Workspace(None)
    assert hasattr(workspace, "_sync_kind")
    use_lsp_line_model(workspace)
    assert isinstance(workspace, LspWorkspace)
    workspace.put_text_document(types_item("file:///a.py", "x = 1\x0cy = 2\n"))
    document = workspace.get_text_document("file:///a.py")
    assert document.lines == ("x = 1\x0cy = 2\n",)  # one LSP line: a form feed is not a break


def types_item(uri: str, text: str):
    from lsprotocol import types

    return types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
