"""A request's id on every log line emitted while serving it, on the event loop and the worker.

Lines of concurrent requests interleave in the log (a keystroke's request supersedes the one
before while it is still decoding), so each line says whose it is, as llm-ls opens a span per
request. The id lives in a ``ContextVar``: the protocol sets it for each request it hands to a
handler (pygls runs each message in a copy of the context, and a coroutine handler's task keeps
it), the scheduler runs a job in the context it was submitted from, and ``RequestIdFilter``
stamps it on each record a handler formats (``LOG_FORMAT``). Idle-time work planned after an
answer carries the id of the request it followed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator
from contextvars import ContextVar

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request)s: %(message)s"

_current: ContextVar[str | None] = ContextVar("lsp_server_request_id", default=None)
_own_ids = itertools.count(1)


def current() -> str | None:
    """The id of the request being served in this context, if any."""
    return _current.get()


@contextlib.contextmanager
def serving(request_id: int | str) -> Iterator[str]:
    """Log lines emitted in this context, and in tasks and jobs started from it, carry
    ``request_id`` (the LSP request's id)."""
    token = _current.set(str(request_id))
    try:
        yield str(request_id)
    finally:
        _current.reset(token)


@contextlib.contextmanager
def ensure_serving() -> Iterator[str]:
    """The id already set (the LSP request's), else one of this process' own count (``#1``,
    ``#2``...: a request that came another way than over LSP)."""
    request_id = _current.get()
    if request_id is not None:
        yield request_id
        return
    with serving(f"#{next(_own_ids)}") as own:
        yield own


class RequestIdFilter(logging.Filter):
    """Stamps each record with ``request``: `` [request ID]`` while serving one, else empty."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = _current.get()
        record.request = f" [request {request_id}]" if request_id is not None else ""
        return True
