"""The naive prompt the quality benchmark measures the server's context against: the text
before the cursor, cut to the token budget at a line start, nothing else (no tree-sitter rows,
no snippets, no FIM). Kept here, not in the product, which never builds it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from speculative_complete.lsp_server.context.builder import ContextRequest, Prompt
from speculative_complete.lsp_server.context.text import MAX_CHARS_PER_TOKEN, clean


def plain_window(request: ContextRequest) -> Prompt:
    """The text before the cursor, at most ``MAX_CHARS_PER_TOKEN * budget`` characters, starting
    at a line start when it had to be cut. No tokenizer needed (``fit_tokens`` finishes it)."""
    max_chars = max(request.budget_tokens, 1) * MAX_CHARS_PER_TOKEN
    offset = max(0, min(request.offset, len(request.text)))
    start = max(0, offset - max_chars)
    window = request.text[start:offset]
    if start > 0:
        newline = window.find("\n")
        if 0 <= newline < len(window) - 1:
            start += newline + 1
            window = window[newline + 1 :]
    return Prompt(text=clean(window), start=start)


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
        text = text[len(text) - keep :] if keep > 0 else ""
        newline = text.find("\n")
        if 0 <= newline < len(text) - 1:
            text = text[newline + 1 :]
        ids = list(encode(text))
    return ids[-budget:] if budget > 0 else []
