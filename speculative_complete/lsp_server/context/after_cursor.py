"""The text after the cursor that a prompt shows: filled into a FIM template's suffix slot, or
handed to an engine's own FIM as text, within ``SUFFIX_SHARE`` of the budget."""

from __future__ import annotations

from speculative_complete.lsp_server.context import fim
from speculative_complete.lsp_server.context.request import ContextRequest
from speculative_complete.lsp_server.context.text import MAX_CHARS_PER_TOKEN, clean
from speculative_complete.lsp_server.context.tokens import Tokens

SUFFIX_SHARE = 0.25


def after_cursor(
    request: ContextRequest,
    template: fim.FimTemplate | None,
    offset: int,
    tokens: Tokens,
    budget: int,
) -> tuple[str, list[int], int]:
    """The text after the cursor the prompt shows, its ids (those a FIM template fills in), and
    the tokens it and the template cost: nothing without FIM or an engine's own FIM."""
    share = int(budget * SUFFIX_SHARE)
    if template is not None:
        suffix, suffix_ids = fim_suffix(request.text, offset, tokens, share)
        return suffix, suffix_ids, fim.overhead(template, tokens)
    if request.engine_suffix:
        suffix = engine_suffix(request.text, offset, tokens, share)
        return suffix, [], tokens.count(suffix)
    return "", [], 0


def fim_suffix(text: str, offset: int, tokens: Tokens, budget: int) -> tuple[str, list[int]]:
    """The text after the cursor for a FIM prompt: whole lines, nearest first, within budget."""
    end = offset
    while end < len(text) and end - offset < budget * MAX_CHARS_PER_TOKEN:
        newline = text.find("\n", end)
        end = len(text) if newline < 0 else newline + 1
    suffix = clean(text[offset:end])
    ids = tokens.ids(suffix)
    while len(ids) > budget and suffix:
        cut = suffix.rstrip("\n").rfind("\n")
        suffix = suffix[: cut + 1] if cut >= 0 else ""
        ids = tokens.ids(suffix)
    return suffix, ids


def engine_suffix(text: str, offset: int, tokens: Tokens, budget: int) -> str:
    """The suffix for an engine's own FIM: whole lines, nearest first, within ``budget`` as
    counted (estimated, for a remote tokenizer)."""
    end, kept = offset, offset
    while end < len(text) and end - offset < budget * MAX_CHARS_PER_TOKEN:
        newline = text.find("\n", end)
        end = len(text) if newline < 0 else newline + 1
        if tokens.count(clean(text[offset:end])) > budget:
            break
        kept = end
    return clean(text[offset:kept])
