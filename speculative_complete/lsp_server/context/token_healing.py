"""The prompt's end, healed: where the cursor is mid-word, after a space or indentation, or at a
line start, the prompt's last token is backed up over
(``speculative_complete.decoding.engine.healing.back_up``) and the text removed is what the
completion must start with."""

from __future__ import annotations

import re
from dataclasses import dataclass

from speculative_complete.lsp_server.context.request import ContextRequest
from speculative_complete.lsp_server.context.tokens import Tokens

HEALABLE = (" ", "\t", "\n")  # after a space, indentation, or at a line start
_WORD_END = re.compile(r"\w\Z")


@dataclass(frozen=True)
class Above:
    """The prompt's text before the cursor and its ids; where the cursor's line goes after the
    middle marker, the rows that go there before it: their text, and how many ids the middle
    holds (the end of ``ids``: those rows', then the line's)."""

    text: str
    ids: list[int]
    middle: str = ""
    middle_ids: int = 0


@dataclass(frozen=True)
class End:
    """The prompt's end, healed: the text before the cursor and the ids of the prefix slot, the
    ids after the middle marker and the line they hold, and the text healing backed up over."""

    text: str
    ids: list[int]
    middle: list[int]
    line: str
    healed: str


def healed_end(
    above: Above, line: str, line_ids: list[int] | None, request: ContextRequest, tokens: Tokens
) -> End:
    """Heal the prompt's end: the cursor's ``line`` alone where it goes after the middle marker
    (``line_ids``, the end of ``above.ids``), else the whole prefix; ``line`` is kept for an
    engine's own FIM, which takes the cursor's line apart."""
    prefix, ids = above.text, above.ids
    if line_ids is not None:
        start = len(ids) - above.middle_ids
        before = prefix[: len(prefix) - len(line)]
        line, middle, healed = (
            backed_up(line, line_ids, tokens, whole=True) if request.heal else (line, line_ids, "")
        )
        rows = ids[start : len(ids) - len(line_ids)]
        return End(before + line, ids[:start], rows + middle, above.middle + line, healed)
    line_start = len(prefix) - len(line)
    prefix, ids, healed = backed_up(prefix, ids, tokens) if request.heal else (prefix, ids, "")
    line = prefix[min(max(line_start, 0), len(prefix)) :] if request.engine_suffix else ""
    return End(prefix, ids, [], line, healed)


def backed_up(prefix: str, ids: list[int], tokens: Tokens, whole: bool = False) -> tuple[str, list[int], str]:
    """The prompt backed up over its last token where the cursor is mid-word or after whitespace
    (token healing): its text, its ids, and the text removed, which the output must begin with.
    ``whole``: the text may be backed up over entirely (a FIM middle: the prompt goes on before it)."""
    if not prefix or not (prefix.endswith(HEALABLE) or _WORD_END.search(prefix)):
        return prefix, ids, ""
    from speculative_complete.decoding.engine.healing import back_up

    cut = back_up(ids, prefix, tokens.decode, tokens.healing_index)
    if cut.removed and (len(cut.removed) < len(prefix) or whole):
        return prefix[: -len(cut.removed)], cut.ids, cut.removed
    return prefix, ids, ""
