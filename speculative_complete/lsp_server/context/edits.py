"""Recently edited regions, across documents: what the user was just working on elsewhere.

Code typed in one file often continues work just done in another (a function added, then called;
a field renamed, then used). llama.vim keeps a ring of chunks of recently edited, yanked and saved
text and sends it with every request; this is the same ring, fed by ``didChange``: each edit keeps
the lines around it, a later edit near the same place replaces that chunk, the oldest chunk goes
when the ring is full, and a chunk too similar to a newer one goes with it (as llama.vim evicts).

A prompt shows the chunks of *other* documents only (the current one is the prompt's own rows), so
typing in one document never changes what its prompt shows of the ring, and the KV cache keeps
its prefix across keystrokes; the ring changes the prompt when the user comes back from editing
elsewhere, once. The builder skips a chunk that mostly repeats text the prompt already holds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from speculative_complete.lsp_server.context.snippets import Snippet, identifiers

LINES_ABOVE = 4
LINES_BELOW = 7
MAX_CHUNKS = 8
MAX_LINE_CHARS = 200
SIMILAR = 0.9  # identifier overlap (Jaccard) above which an older chunk is a repeat of a newer one


@dataclass(frozen=True)
class EditedChunk:
    uri: str
    first_line: int
    text: str

    def snippet(self) -> Snippet:
        return Snippet(self.uri, self.first_line, self.text, 0.0, "edit")


class EditRing:
    """The last ``MAX_CHUNKS`` edited regions, newest last (event loop only)."""

    def __init__(self, max_chunks: int = MAX_CHUNKS) -> None:
        self._chunks: deque[EditedChunk] = deque()
        self.max_chunks = max_chunks

    def edited(self, uri: str, text: str, line: int) -> None:
        """``uri`` (whose text is now ``text``) was edited at ``line``: keep the lines around it."""
        if line < 0:
            return
        lines = text.split("\n", line + LINES_BELOW + 1)[: line + LINES_BELOW + 1]  # no further
        first = max(0, line - LINES_ABOVE)
        kept = [row[:MAX_LINE_CHARS] for row in lines[first : line + LINES_BELOW + 1]]
        chunk = EditedChunk(uri, first, "\n".join(kept).strip("\n"))
        if not chunk.text.strip():
            return
        names = identifiers(chunk.text)
        self._chunks = deque(
            old
            for old in self._chunks
            if not _same_place(old, chunk) and _similarity(identifiers(old.text), names) < SIMILAR
        )
        self._chunks.append(chunk)
        while len(self._chunks) > self.max_chunks:
            self._chunks.popleft()

    def forget(self, uri: str) -> None:
        """``uri``'s chunks go (its file was deleted or renamed away)."""
        self._chunks = deque(c for c in self._chunks if c.uri != uri)

    def others(self, uri: str) -> tuple[Snippet, ...]:
        """The chunks of documents other than ``uri``, newest first."""
        return tuple(c.snippet() for c in reversed(self._chunks) if c.uri != uri)


def _same_place(old: EditedChunk, new: EditedChunk) -> bool:
    span = LINES_ABOVE + LINES_BELOW + 1
    return old.uri == new.uri and abs(old.first_line - new.first_line) < span


def _similarity(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0
