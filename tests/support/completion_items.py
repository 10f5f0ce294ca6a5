"""What the server answers for a decoded text at a cursor (the insert text and its range), through
the server's own document, cursor and post-processing code."""

from __future__ import annotations

from lsprotocol import types
from pygls.workspace import PositionCodec

from speculative_complete.lsp_server import postprocess
from speculative_complete.lsp_server.context.languages import detect
from speculative_complete.lsp_server.documents import LspTextDocument, locate


def position(text: str, offset: int) -> types.Position:
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return types.Position(line, len(text[start:offset].encode("utf-16-le")) // 2)


def item_for(
    text: str,
    offset: int,
    decoded: str,
    uri: str = "file:///t.py",
    language_id: str | None = None,
    multiline: str = "auto",
    max_lines: int = 12,
) -> tuple[str | None, tuple[int, int, int]]:
    """What the server answers for ``decoded`` at ``offset``: the insert text and its range. The
    engine ends a multi-line decode where the block ends (``stop_when``), as the server asks it to."""
    cursor = locate(LspTextDocument(uri, text, position_codec=PositionCodec()), position(text, offset))
    situation = postprocess.situation_for(
        text, cursor.offset, cursor.before, cursor.after, detect(language_id, uri), multiline, max_lines
    )
    if situation.ending.multiline and (cut := situation.ending.cut(decoded)) is not None:
        decoded = decoded[:cut]
    return postprocess.finish(decoded, situation), (cursor.line, cursor.character, cursor.end_character)
