"""Server-sent events as both APIs stream them: ``data: {json}`` lines, blank lines between events,
and OpenAI's closing ``data: [DONE]``. Pure functions over decoded lines, so the fault cases
(a cut line, a body that is not JSON) are tested without a socket."""

from __future__ import annotations

import json
from typing import Any

DONE = object()  # the stream's own end marker


class MalformedEvent(ValueError):
    """A data line that is not a JSON object; the engine (or a proxy in front of it) is broken."""


def parse_line(line: str) -> dict[str, Any] | object | None:
    """One line of the stream: a JSON object, ``DONE``, or None (nothing to act on); raises
    MalformedEvent for a line that is neither."""
    line = line.rstrip("\r")
    if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
        return None
    if not line.startswith("data:"):
        # an error answered as a plain JSON body in place of a stream; anything else is garbage
        return _json(line)
    data = line[5:].lstrip(" ")
    if data == "[DONE]":
        return DONE
    return _json(data)


def _json(data: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise MalformedEvent(f"malformed JSON in the stream: {data[:120]!r}") from None
    if not isinstance(value, dict):
        raise MalformedEvent(f"expected a JSON object in the stream, got {data[:120]!r}")
    return value
