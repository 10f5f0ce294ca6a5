"""What the local engine is asked to decode: the one place settings become a ``GenerationConfig``.

Three decodes, all on a document's KV cache and greedy chain: a request's (``for_request``), and
two decoded ahead in idle time (``ahead``): the rest of a block answered early, and the line after
the suggestion. ``decoding`` (torch) is imported inside the functions, never at import.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import Prompt
from speculative_complete.lsp_server.ending import Ending

if TYPE_CHECKING:
    from speculative_complete.decoding import GenerationConfig

AHEAD_LINES = 2  # the chain may run this many line ends past the prompt before the next line is not decoded


def keeps_chains(settings: Settings, cache_key: str | None) -> bool:
    """Whether a document's greedy chain is kept and answers the next request from it: what an
    early answer relies on to hand the rest of a block to the next request."""
    return (
        cache_key is not None
        and settings.kv_cache_mb > 0
        and settings.type_ahead
        and settings.decoder == "speculative"
    )


def for_request(
    settings: Settings,
    prompt: Prompt,
    ending: Ending,
    cache_key: str | None,
    deadline: float | None,
    answer_by: float | None,
) -> GenerationConfig:
    """A request's decode: until ``ending`` says the suggestion is over. A multi-line body is
    answered with its whole lines from ``answer_by`` on, where the chain keeps the rest, and from
    ``deadline`` on in any case."""
    from speculative_complete.decoding import GenerationConfig

    early = answer_by if keeps_chains(settings, cache_key) else None
    return GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        stop_at_newline=ending.stop_at_newline,
        reuse_continuation=settings.type_ahead,
        required_prefix=prompt.healed,
        stop_strings=prompt.stop_strings,
        stop_when=ending.cut if ending.multiline else None,
        answer_due=_due_at(_earliest(early, deadline)) if ending.multiline else None,
    )


def ahead(settings: Settings, past: str, past_tokens: int, rest: Ending | None) -> GenerationConfig | None:
    """How to decode on along a greedy chain that holds ``past`` (``past_tokens`` tokens) beyond
    the user's text: to where ``rest`` ends a block answered early, within the tokens the request
    itself could have decoded; else, where ``prefetch`` is on, the line after, unless the chain
    runs ``AHEAD_LINES`` line ends past the user's text already. None: nothing to decode (the
    chain reaches far enough, or the token limit)."""
    from speculative_complete.decoding import GenerationConfig

    if rest is None:
        if not settings.prefetch or past.count("\n") >= AHEAD_LINES:
            return None
        return GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_at_newline=True, ahead=True)
    remaining = settings.max_new_tokens - past_tokens
    if remaining <= 0 or rest.cut(past) is not None:
        return None

    def block_end(text: str) -> int | None:
        cut = rest.cut(past + text)
        return None if cut is None else max(0, cut - len(past))

    return GenerationConfig(max_new_tokens=remaining, stop_when=block_end, ahead=True)


def _earliest(*times: float | None) -> float | None:
    return min((t for t in times if t is not None), default=None)


def _due_at(answer_by: float | None) -> Callable[[float], bool] | None:
    """The engine's ``answer_due`` check for a first answer due at ``answer_by``: due once a pass
    of the given milliseconds, started now, would end past it."""
    if answer_by is None:
        return None
    return lambda next_pass_ms: time.monotonic() + next_pass_ms / 1000 >= answer_by
