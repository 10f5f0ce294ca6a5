"""What the server remembers of its answers: repeated requests, and the suggestion on screen.

Two cheap checks on the event loop, before any work is scheduled:

- A request identical to an earlier one gets the earlier answer from a small LRU: greedy
  decoding is deterministic, so that is exactly what decoding again would give. Editors re-ask
  often (focus changes, a cursor moved back and forth). Identical means the same prompt, and the
  prompt depends on more than the document text, the cursor and the settings: the prompt builder
  keeps the rows it showed across lines (``ContextBuilder.state``), so the same text and cursor
  reached after another path shows other rows and may be answered otherwise. The key therefore
  holds that state too; an answer is kept under the state its own prompt left behind, which builds
  the same prompt again (the next identical request sees it), and not kept where there is none.
  Comparing the state costs a hash of the rows' text, once per state.
- A request whose document differs from the one the shown suggestion was made for only by
  characters typed at the cursor that match the suggestion's start is typed-ahead: it skips the
  debounce. The answer itself comes from the engine's greedy chain for the document (see
  ``speculative_complete/decoding/kv_cache.py``): the remainder with no target pass, and exact by
  construction, since it is checked token by token rather than character by character here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

RESULT_CACHE_SIZE = 128
TYPED_AHEAD_MAX_CHARS = 1 << 20  # larger documents skip the text comparison (it copies the text)

# (uri, text length, text hash, cursor, settings and the like, the prompt builder's state)
Key = tuple[str, int, int, int, tuple, Hashable]


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
    def key(uri: str, source: str, offset: int, settings_key: tuple, context: Hashable = None) -> Key:
        """``context``: the prompt builder's state for the document (``ContextBuilder.state``)."""
        # str caches its hash, so this costs one pass over a new text and nothing after.
        return (uri, len(source), hash(source), offset, settings_key, context)

    @staticmethod
    def with_context(key: Key, context: Hashable) -> Key:
        """``key`` for the same request made with the prompt builder in state ``context``."""
        return (*key[:5], context)

    def result(self, key: Key) -> tuple[bool, str | None]:
        """(found, answer): a remembered answer for an identical request (None: no suggestion)."""
        if key not in self._results:
            return False, None
        self._results.move_to_end(key)
        return True, self._results[key]

    def remember(self, key: Key | None, uri: str, source: str, offset: int, text: str | None) -> None:
        """Keep the answer under ``key`` (None: only as the suggestion on screen, for typing ahead)."""
        if key is not None:
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
