"""Typed-ahead reuse for a remote engine: the last streamed continuation per document.

The local engine keeps each document's greedy chain in its KV cache and answers the user typing
along a suggestion without a target pass. A remote engine has no such memory we can read, so the
runtime keeps the text itself: what the prompt showed and what the engine streamed after it, up to
where the suggestion ended. When the next prompt is that text plus characters that match the
continuation's start, the rest of the continuation is the answer (greedy decoding would write it
again) and no request is made. Only a continuation that really ended (a stop: the line end or the
block's end, or the model's end) is kept: one cut by the token limit, a cancel or the budget is
not the whole answer.

Two checks, both needed: ``typed_along`` on the document (before the prompt is built, so typing
along costs no ``/tokenize`` round trip either) and ``answer`` on the prompt's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from speculative_complete.lsp_server.context import Prompt
from speculative_complete.lsp_server.ending import Ending

MAX_CHAINS = 64  # documents


@dataclass(frozen=True)
class Chain:
    shown: str  # what the prompt showed before the cursor (its text plus the healed text)
    continuation: str  # what the engine wrote after it, cut where the suggestion ends
    ending: Ending  # the ending it was cut with; another ending needs another answer
    stop_reason: str
    source: str  # the document it was asked for (a reference, not a copy)
    offset: int  # the cursor, in code points
    prompt: Prompt


def typed_along(old: str, old_offset: int, new: str, new_offset: int) -> str | None:
    """What was typed at ``old_offset`` if ``new`` is ``old`` with only that inserted; else None."""
    typed = new_offset - old_offset
    if typed <= 0 or len(new) != len(old) + typed:
        return None
    if new[new_offset:] != old[old_offset:] or new[:old_offset] != old[:old_offset]:
        return None
    return new[old_offset:new_offset]


class Chains:
    """Per document, the newest complete continuation (worker thread only)."""

    def __init__(self) -> None:
        self._by_uri: dict[str, Chain] = {}

    def keep(self, uri: str, chain: Chain) -> None:
        self._by_uri.pop(uri, None)
        self._by_uri[uri] = chain
        while len(self._by_uri) > MAX_CHAINS:
            del self._by_uri[next(iter(self._by_uri))]

    def forget(self, uri: str) -> None:
        self._by_uri.pop(uri, None)

    def clear(self) -> None:
        self._by_uri.clear()

    def prompt_for(self, uri: str, source: str, offset: int) -> Prompt | None:
        """A prompt that ``answer`` will recognise, when the document differs from the chain's only
        by characters typed at its cursor that the continuation starts with; else None."""
        chain = self._by_uri.get(uri)
        if chain is None:
            return None
        typed = typed_along(chain.source, chain.offset, source, offset)
        if typed is None or not chain.continuation.startswith(typed):
            return None
        return Prompt(
            text=chain.shown + typed,
            start=chain.prompt.start,
            ids=None,
            language=chain.prompt.language,
            snippets=chain.prompt.snippets,
        )

    def answer(self, uri: str, prompt: Prompt, ending: Ending) -> tuple[str, Chain] | None:
        """The rest of the kept continuation after what ``prompt`` shows, if it goes along it."""
        chain = self._by_uri.get(uri)
        if chain is None or chain.ending != ending:
            return None
        shown = prompt.text + prompt.healed
        if not shown.startswith(chain.shown):
            return None
        typed = shown[len(chain.shown) :]
        if not typed or not chain.continuation.startswith(typed):
            return None  # nothing typed is a repeat: the engine is asked (the memory has those)
        return chain.continuation[len(typed) :], chain
