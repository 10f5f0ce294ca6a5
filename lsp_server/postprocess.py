"""Turn decoded text into the item's insert text: whole line, no duplicated suffix, never blank.

Every item replaces the range from the cursor to the end of the line, so its text is what the
rest of the line should become. The model sees only the text before the cursor, so when the
user already has text after the cursor (typically closing brackets the editor auto-inserted),
the suggestion is merged with it rather than inserted in front of it:

- the suggestion already contains that text in order (``"a, b)"`` over ``")"``): it replaces it;
- otherwise the user's text is kept after the suggestion, minus any overlap (``"x)"`` + ``"):"``
  gives ``"x):"``).
"""

from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"  # what a token that splits a UTF-8 sequence decodes to


def clean_decoded(text: str, healed: str = "", multiline: bool = False) -> str | None:
    """The usable part of a decode: the held-back prefix checked and removed, one line unless
    ``multiline``, no trailing whitespace or broken characters. None: nothing usable."""
    if healed:
        if not text.startswith(healed):
            return None  # the model did not continue the way the user's whitespace requires
        text = text[len(healed):]
    if not multiline:
        text = text.split("\n", 1)[0].split("\r", 1)[0]
    text = text.rstrip().rstrip(REPLACEMENT_CHAR).rstrip()
    return text if text.strip() else None


def is_subsequence(needle: str, haystack: str) -> bool:
    chars = iter(haystack)
    return all(ch in chars for ch in needle)


def merge_with_suffix(suggestion: str, after: str) -> str:
    """The new rest of the line, given the suggestion and the text already after the cursor."""
    tail = after.rstrip()
    if not tail.strip() or is_subsequence(tail, suggestion):
        return suggestion
    overlap = next((k for k in range(min(len(tail), len(suggestion)), 0, -1)
                    if suggestion.endswith(tail[:k])), 0)
    return suggestion + tail[overlap:]


def line_item_text(decoded: str, after: str, healed: str = "", multiline: bool = False) -> str | None:
    """The insert text for the range cursor..end of line, or None when there is nothing to offer
    (an empty or blank suggestion, or one that leaves the line as it is)."""
    multiline = multiline and not after.strip()  # several lines only where the line's rest is blank
    suggestion = clean_decoded(decoded, healed, multiline)
    if suggestion is None:
        return None
    text = merge_with_suffix(suggestion, after)
    if not text.strip() or text == after or text.rstrip() == after.rstrip():
        return None
    return text
