"""What the server remembers of its answers: repeated requests, and the suggestion on screen.

Two cheap checks on the event loop, before any work is scheduled:

- A request identical to an earlier one (same document text, same cursor, same settings) gets the
  earlier answer from a small LRU: greedy decoding is deterministic, so that is exactly what
  decoding again would give. Editors re-ask often (focus changes, a cursor moved back and forth).
- A request whose document differs from the one the shown suggestion was made for only by
  characters typed at the cursor that match the suggestion's start is typed-ahead: it skips the
  debounce. The answer itself comes from the engine's greedy chain for the document (see
  ``decoding/kv_cache.py``): the remainder with no target pass, and exact by construction, since
  it is checked token by token rather than character by character here.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

RESULT_CACHE_SIZE = 128
TYPED_AHEAD_MAX_CHARS = 1 << 20  # larger documents skip the text comparison (it copies the text)

Key = tuple[str, int, int, int, tuple]


@dataclass(frozen=True)
class Shown:
    """The last suggestion answered on a document, and the document it was made for."""

    source: str  # the whole document text (a reference, not a copy)
    offset: int  # the cursor, in code points
    text: str  # the item's insert text: what cursor..end of line becomes


class SuggestionMemory:
    def __init__(self, size: int = RESULT_CACHE_SIZE) -> None:
        self.size = size
        self._results: OrderedDict[Key, str | None] = OrderedDict()
        self._shown: dict[str, Shown] = {}

    @staticmethod
    def key(uri: str, source: str, offset: int, settings_key: tuple) -> Key:
        # str caches its hash, so this costs one pass over a new text and nothing after.
        return (uri, len(source), hash(source), offset, settings_key)

    def result(self, key: Key) -> tuple[bool, str | None]:
        """(found, answer): a remembered answer for an identical request (None: no suggestion)."""
        if key not in self._results:
            return False, None
        self._results.move_to_end(key)
        return True, self._results[key]

    def remember(self, key: Key, uri: str, source: str, offset: int, text: str | None) -> None:
        self._results[key] = text
        self._results.move_to_end(key)
        while len(self._results) > self.size:
            self._results.popitem(last=False)
        if text is None:
            self._shown.pop(uri, None)
        else:
            self._shown[uri] = Shown(source, offset, text)

    def typed_ahead(self, uri: str, source: str, offset: int) -> str | None:
        """The part of the shown suggestion still to come, if the user has typed its start; else None."""
        shown = self._shown.get(uri)
        if shown is None or len(source) > TYPED_AHEAD_MAX_CHARS:
            return None
        typed = offset - shown.offset
        if not 0 < typed < len(shown.text) or len(source) != len(shown.source) + typed:
            return None
        if not shown.text.startswith(source[shown.offset : offset]):
            return None
        start = shown.offset
        if source[offset:] != shown.source[start:] or source[:start] != shown.source[:start]:
            return None
        return shown.text[typed:]

    def forget(self, uri: str) -> None:
        self._shown.pop(uri, None)
        for key in [k for k in self._results if k[0] == uri]:
            del self._results[key]

    def clear(self) -> None:
        self._results.clear()
        self._shown.clear()
