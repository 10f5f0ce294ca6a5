"""The document's text as the prompt takes it: safe to encode, split into rows, cut to a budget."""

from __future__ import annotations

from speculative_complete.lsp_server.context.tokens import Tokens

MAX_CHARS_PER_TOKEN = 8  # generous: code averages ~3-4 characters per token


def clean(text: str) -> str:
    """Lone surrogates (possible in JSON strings) would make the tokenizer raise; each becomes one
    "?", so offsets do not move."""
    return text.encode("utf-8", "replace").decode("utf-8")


def split_rows(text: str) -> list[str]:
    """Rows as tree-sitter counts them: broken after each ``\\n`` only, the break kept."""
    rows = text.split("\n")
    return [row + "\n" for row in rows[:-1]] + [rows[-1]]


def fit_exact(text: str, tokens: Tokens, budget: int) -> tuple[str, list[int]]:
    """The longest end of ``text`` that starts at a line start (or, for one over-long line, at a
    character) and encodes to at most ``budget`` tokens; the ids are exactly its encoding."""
    ids = tokens.encode(text)
    while len(ids) > budget and text:
        keep = max(int(len(text) * budget / len(ids) * 0.95), 0)
        cut = text[len(text) - keep :] if keep else ""
        newline = cut.find("\n")
        if 0 <= newline < len(cut) - 1 and newline < len(cut) // 2:
            cut = cut[newline + 1 :]
        text = cut if len(cut) < len(text) else text[1:]
        ids = tokens.encode(text)
    return text, ids
