"""The prompt: a plain window of text before the cursor, trimmed to a token budget.

This is the seam for the tree-sitter context issue: ``build_prompt`` is the only function the
server calls to turn a document and a cursor into a ``Prompt``; a smarter builder (enclosing
scopes, imports, the suffix) replaces it with the same signature. Windowing happens in two steps
so a 10 MB document costs the same as a small one: a character window here on the event loop
(bounded by ``MAX_CHARS_PER_TOKEN`` times the budget), then ``fit_tokens`` on the worker thread,
where the tokenizer lives.

Trailing-whitespace healing: BPE tokenizers glue a space to the word after it (" return") and a
newline to the indentation after it ("\\n       "), so a prompt that ends in the space the user
just typed asks the model to continue from a token it rarely saw in that position, and it slips
(measured on SmolLM2: after an indented newline it answers nothing). Holding back one trailing
space or tab and requiring the completion to start with it puts the prompt back on a natural
token boundary; ``postprocess`` checks and strips the held-back character.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_CHARS_PER_TOKEN = 8  # generous: code averages ~3-4 characters per token
HEALABLE = (" ", "\t")


@dataclass(frozen=True)
class ContextRequest:
    """What a context builder may look at; later builders may use uri and language_id."""

    text: str  # the whole document
    offset: int  # the cursor, in code points
    budget_tokens: int
    uri: str = ""
    language_id: str | None = None


@dataclass(frozen=True)
class Prompt:
    text: str  # fed to the model: the window before the cursor, minus ``healed``
    healed: str = ""  # held back from the end of the window; the completion must start with it
    start: int = 0  # where the window starts in the document, in code points


def plain_window(request: ContextRequest) -> Prompt:
    """The text before the cursor, at most ``MAX_CHARS_PER_TOKEN * budget`` characters, starting
    at a line start when it had to be cut."""
    max_chars = max(request.budget_tokens, 1) * MAX_CHARS_PER_TOKEN
    offset = max(0, min(request.offset, len(request.text)))
    start = max(0, offset - max_chars)
    window = request.text[start:offset]
    if start > 0:
        newline = window.find("\n")
        if 0 <= newline < len(window) - 1:
            start += newline + 1
            window = window[newline + 1:]
    # Lone surrogates (possible in JSON strings) would make the tokenizer raise.
    window = window.encode("utf-8", "replace").decode("utf-8")
    healed = ""
    if len(window) > 1 and window.endswith(HEALABLE):
        window, healed = window[:-1], window[-1]
    return Prompt(text=window, healed=healed, start=start)


build_prompt: Callable[[ContextRequest], Prompt] = plain_window


def fit_tokens(text: str, encode: Callable[[str], Sequence[int]], budget: int) -> list[int]:
    """``text`` tokenized, keeping at most ``budget`` tokens from its end.

    Cutting characters and re-encoding (rather than slicing token ids) lets the prompt start at a
    line start, which the model has seen far more often than half a line.
    """
    ids = list(encode(text))
    for _ in range(3):
        if len(ids) <= budget:
            return ids
        keep = int(len(text) * budget / len(ids) * 0.9)
        text = text[len(text) - keep:] if keep > 0 else ""
        newline = text.find("\n")
        if 0 <= newline < len(text) - 1:
            text = text[newline + 1:]
        ids = list(encode(text))
    return ids[-budget:] if budget > 0 else []
