"""Where a generation's text ends: EOS, the token limit, stop strings and a caller's own stop.

Stops are decided on the decoded text, not on token ids: a stop string (a line end, a closing
bracket) may sit inside one token or span two, and a healed prompt's required text must be
written before any stop can count. Kept apart from the loop so that the engine and the
transformers peer (``transformers_peer.py``) cut their tokens by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from speculative_complete.decoding.results import StopReason

Decode = Callable[[Sequence[int]], str]
StopWhen = Callable[[str], int | None]


class Cut(NamedTuple):
    """The tokens to keep, their text (after the required prefix), why generation stopped (None:
    go on) and how many generated tokens that decision consumed (the kept ones plus the one
    that stopped it)."""

    tokens: list[int]
    text: str
    reason: StopReason | None
    consumed: int


def covered(text: str, prefix: str) -> int:
    """How many leading characters of ``text`` belong to the required prefix: all of it once
    generated, else the part generated so far (the text is still inside the prefix)."""
    if not prefix:
        return 0
    if text.startswith(prefix):
        return len(prefix)
    return min(len(prefix), len(text))  # still inside it (or a tokenizer that normalizes text)


def tokens_before(decode: Decode, generated: Sequence[int], chars: int) -> int:
    """How many leading ``generated`` tokens have their text within its first ``chars``."""
    keep = 0
    while keep < len(generated) and len(decode(generated[: keep + 1])) <= chars:
        keep += 1
    return keep


def cut_at_stop(
    decode: Decode,
    generated: list[int],
    stops: tuple[str, ...],
    eos: frozenset[int],
    max_new: int,
    prefix: str = "",
    stop_when: StopWhen | None = None,
) -> Cut:
    """Apply EOS, the token limit and stop strings to the tokens generated so far; stops are
    looked for only after ``prefix`` (the required text of a healed prompt)."""
    reason = None
    for i, token in enumerate(generated):
        if token in eos:
            generated, reason = generated[:i], "eos"
            break
    consumed = len(generated) + (reason == "eos")
    if len(generated) >= max_new:
        generated, reason, consumed = generated[:max_new], reason or "max_tokens", min(consumed, max_new)
    full = decode(generated)
    skip = covered(full, prefix)
    text = full[skip:]

    def cut_of(body: str) -> int:
        found = [pos for pos in (body.find(s) for s in stops) if pos >= 0]
        custom = stop_when(body) if stop_when is not None and body else None
        if custom is not None:
            found.append(max(0, min(custom, len(body))))
        return min(found, default=-1)

    cut = cut_of(text)
    if cut < 0:
        return Cut(generated, text, reason, consumed)
    keep = tokens_before(decode, generated, skip + cut)
    seen = keep + 1  # the first prefix whose text already contains a stop
    while seen < len(generated) and cut_of(decode(generated[:seen])[skip:]) < 0:
        seen += 1
    return Cut(generated[:keep], text[:cut], "stop", seen)


def whole_lines(
    decode: Decode, generated: list[int], text: str, due: Callable[[], bool]
) -> tuple[list[int], str] | None:
    """Once ``due()`` says an answer is due: ``text`` (all the generated text after the required
    prefix, no stop having cut it) up to its last line end, and the tokens within it. None while
    it is not due, or while no whole line with something on it is ready (then decoding goes on
    until one is)."""
    end = text.rfind("\n")
    if end < 0 or not text[:end].strip() or not due():
        return None
    skip = len(decode(generated)) - len(text)
    return generated[: tokens_before(decode, generated, skip + end)], text[:end]


@dataclass
class EndingTokens:
    """The tokens that end a generation wherever they come (once no required text is owed): an
    end-of-text token, or one whose own text holds a stop string. A greedy draft is worth
    verifying only up to the token before one: the pass's row there gives the target's own token
    anyway, so a drafted one there (and any after it) is a row bought for nothing. The first
    token of a line's end is most of what a keystroke's prefill drafts past."""

    decode: Decode
    stops: tuple[str, ...]
    eos: frozenset[int]
    _known: dict[int, bool] = field(default_factory=dict)  # memo by token id

    def __call__(self, token: int) -> bool:
        ends = self._known.get(token)
        if ends is None:
            text = self.decode([token])
            ends = self._known[token] = token in self.eos or any(stop in text for stop in self.stops)
        return ends

    def length_before(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, come before the first that ends a generation."""
        return next((i for i, token in enumerate(tokens) if self(token)), len(tokens))
