"""Token healing: back the prompt up over its last token, then make the output start with it.

A prompt that ends mid-word (``_iterencode_dic``) or in indentation (``"\\n    "``) ends on a token
the model rarely saw in that position: BPE glues a space to the word after it and a newline to
the indentation after it, so in training text ``"\\n    "`` is mostly followed by the rest of a
longer whitespace token or by a word token that starts with a space. Conditioned on the odd
boundary, the model slips (SmolLM2 writes ``(o,`` after ``_iterencode_dic`` and drops the ``t``,
and answers an empty line after indentation). Healing removes the last token(s) from the prompt
and constrains the first generated token(s) to be consistent with the removed text, so the model
picks the tokenization itself (``dict``, ``"\\n   " + " return"``).

Everything here is pure and works on bytes: a token's bytes are what it contributes to the
decoded text, which keeps multi-byte characters split across tokens exact. The table of every
token's bytes is built once per tokenizer (49k entries for SmolLM2, 262k for Gemma 3), not per
request; ``HealingIndex`` answers "which tokens may come next" from it in time proportional to
the answer, with a small cache because the same remaining texts (a space, a newline with
indentation) come up again and again.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

MAX_BACKUP_TOKENS = 3  # only to step over a character split between tokens
BLANK = (b" ", b"\t", b"\n", b"\r")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable stand-in character -> the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _decoder_kind(tokenizer: Any) -> str:
    """ "byte_level", "sentencepiece" or "generic", from a fast tokenizer's decoder config."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return "generic"
    try:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
    except Exception:
        return "generic"
    if '"ByteLevel"' in decoder:
        return "byte_level"
    if "\u2581" in decoder or '"Metaspace"' in decoder or '"ByteFallback"' in decoder:
        return "sentencepiece"
    return "generic"


def _special_ids(tokenizer: Any) -> set[int]:
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


def token_bytes_table(tokenizer: Any, vocab_size: int | None = None) -> list[bytes | None]:
    """The bytes each token id contributes to decoded text; None for special tokens and ids the
    tokenizer does not know (a model's embedding matrix is often padded past the vocabulary).

    Byte-level BPE (GPT-2, SmolLM2, Qwen, StarCoder): exact, from the pieces. SentencePiece
    (Llama 2, Gemma): pieces with ``▁`` as a space and ``<0xNN>`` byte-fallback pieces. Anything
    else: each token decoded after a fixed anchor token, so a decoder that strips a leading space
    from the first token cannot hide it; a token that decodes to a broken character is None.
    """
    size = int(vocab_size if vocab_size is not None else len(tokenizer))
    known = min(size, len(tokenizer)) if hasattr(tokenizer, "__len__") else size
    special = _special_ids(tokenizer)
    kind = _decoder_kind(tokenizer)
    table: list[bytes | None] = [None] * size
    if kind in ("byte_level", "sentencepiece"):
        pieces = tokenizer.convert_ids_to_tokens(list(range(known)))
        added_tokens = getattr(tokenizer, "added_tokens_decoder", None) or {}
        added = {int(i): t.content for i, t in added_tokens.items()}
        byte_of = _byte_decoder()
        for i, piece in enumerate(pieces):
            if i in special or piece is None:
                continue
            if i in added:
                table[i] = added[i].encode("utf-8")
            elif kind == "byte_level":
                if all(ch in byte_of for ch in piece):
                    table[i] = bytes(byte_of[ch] for ch in piece)
                else:
                    table[i] = piece.encode("utf-8")
            else:
                match = _BYTE_PIECE.match(piece)
                table[i] = (
                    bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode()
                )
        return table

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    anchor = next(
        (i for i in range(known) if i not in special and decode([i]) and "\ufffd" not in decode([i])), None
    )
    head = decode([anchor]) if anchor is not None else ""
    for i in range(known):
        if i in special:
            continue
        text = decode([anchor, i] if anchor is not None else [i])
        if not text.startswith(head):
            continue
        text = text[len(head) :]
        if text and "\ufffd" not in text:
            table[i] = text.encode("utf-8")
    return table


@dataclass
class HealingIndex:
    """Which tokens are consistent with a remaining required text, answered without a vocabulary
    scan: tokens that are a prefix of it by dictionary lookups (one per length), tokens that
    extend it by binary search in the sorted byte strings."""

    table: list[bytes | None]
    _by_bytes: dict[bytes, list[int]] = field(init=False, repr=False)
    _sorted: list[bytes] = field(init=False, repr=False)
    _sorted_ids: list[int] = field(init=False, repr=False)
    _cache: dict[bytes, tuple[int, ...]] = field(init=False, repr=False, default_factory=dict)
    _non_blank: tuple[int, ...] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self._by_bytes = {}
        for i, b in enumerate(self.table):
            if b:
                self._by_bytes.setdefault(b, []).append(i)
        order = sorted((b, i) for i, b in enumerate(self.table) if b)
        self._sorted = [b for b, _ in order]
        self._sorted_ids = [i for _, i in order]
        self._longest = max((len(b) for b in self._sorted), default=0)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, vocab_size: int | None = None) -> HealingIndex:
        return cls(token_bytes_table(tokenizer, vocab_size))

    def allowed(self, remaining: bytes) -> tuple[int, ...]:
        """Every token id whose bytes are prefix-compatible with ``remaining`` (sorted).

        When ``remaining`` ends in whitespace (the user's indentation, the space they typed, a
        line break), a token that goes past it must not go on with more: the user's whitespace
        is final, and a model fond of 4-space indents would otherwise turn two typed spaces into
        six, or write a blank line."""
        if not remaining:
            return ()
        hit = self._cache.get(remaining)
        if hit is not None:
            return hit
        ids: set[int] = set()
        for k in range(1, min(len(remaining), self._longest) + 1):
            ids.update(self._by_bytes.get(remaining[:k], ()))
        start = bisect.bisect_left(self._sorted, remaining)
        final_blank = remaining[-1:] in BLANK
        for j in range(start, len(self._sorted)):
            token = self._sorted[j]
            if not token.startswith(remaining):
                break
            if final_blank and token[len(remaining) : len(remaining) + 1] in BLANK:
                continue
            ids.add(self._sorted_ids[j])
        out = tuple(sorted(ids))
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[remaining] = out
        return out

    def starting_non_blank(self) -> tuple[int, ...]:
        """Every token that does not start with whitespace (what may follow the user's)."""
        if self._non_blank is None:
            self._non_blank = tuple(i for i, b in enumerate(self.table) if b and b[:1] not in BLANK)
        return self._non_blank


class PrefixConstraint:
    """The state of one healed generation: how much of the required text is still owed.

    ``active`` while some of it is owed, and, when it ends in whitespace at a token boundary, for
    the one token after it, which must not start with more whitespace (the user's spaces,
    indentation or line break are final: an empty or over-indented line is never what they
    meant). While active only ``allowed()`` tokens may be chosen (the engine masks the target's
    logits and does not speculate); ``advance`` records each chosen token.
    """

    def __init__(self, index: HealingIndex, required: str) -> None:
        self.index = index
        self.required = required.encode("utf-8")
        self.produced = 0  # bytes of the required text covered so far
        self.failed = False  # set by the engine when no token could continue the required text
        self._after = self.required[-1:] in BLANK  # one more token to check once it is written

    @property
    def active(self) -> bool:
        return self.produced < len(self.required) or (self._after and self.produced == len(self.required))

    @property
    def key(self) -> bytes:
        """What ``allowed()`` depends on (the remaining text; empty for the token after it)."""
        return self.required[self.produced :]

    def allowed(self) -> tuple[int, ...]:
        if not self.active:
            return ()
        if self.produced == len(self.required):
            return self.index.starting_non_blank()
        return self.index.allowed(self.required[self.produced :])

    def allowed_length(self, tokens: Sequence[int], stuck_ends: bool = False) -> int:
        """How many of ``tokens``, from the first, this constraint allows in turn (all of them once
        the text is written); ``stuck_ends``: also stop before a token after which it would
        allow nothing. Walks a copy: this one is left as it is."""
        probe = copy.copy(self)
        for i, token in enumerate(tokens):
            if not probe.active:
                return len(tokens)
            allowed = probe.allowed()
            at = bisect.bisect_left(allowed, token)
            if at == len(allowed) or allowed[at] != token:
                return i
            probe.advance(token)
            if stuck_ends and probe.active and not probe.allowed():
                return i
        return len(tokens)

    def advance(self, token_id: int) -> None:
        if not self.active:
            return
        b = self.index.table[token_id] if 0 <= token_id < len(self.index.table) else None
        if self.produced == len(self.required):
            self._after = False  # the token after the required text: checked, done
            return
        # A token the constraint did not allow (only possible when nothing was allowed) ends it.
        self.produced = self.produced + len(b) if b else len(self.required)
        if self.produced > len(self.required) or not b:
            self._after = False  # it went past the end, already checked by ``allowed``


@dataclass(frozen=True)
class BackedUp:
    """A prompt with its last token(s) removed: feed ``ids``, require the output to start with
    ``removed``."""

    ids: list[int]
    removed: str


def back_up(
    ids: Sequence[int],
    text: str,
    decode: Callable[[Sequence[int]], str],
    index: HealingIndex | None = None,
    max_chars: int = 64,
) -> BackedUp:
    """Remove the prompt's last token, and up to ``MAX_BACKUP_TOKENS`` when a character is split
    between tokens, so that ``decode(ids)`` is an exact prefix of ``text``; ``removed`` is the rest.

    No backing up (``removed == ""``) when the last token is special, unknown to ``index``, longer
    than ``max_chars``, or when no cut leaves an exact prefix of ``text``.
    """
    ids = list(ids)
    if not ids:
        return BackedUp(ids, "")
    if index is not None and not (0 <= ids[-1] < len(index.table) and index.table[ids[-1]]):
        return BackedUp(ids, "")
    for k in range(1, min(MAX_BACKUP_TOKENS, len(ids)) + 1):
        kept = decode(ids[:-k]) if k < len(ids) else ""
        if text.startswith(kept) and "\ufffd" not in kept[-1:]:
            removed = text[len(kept) :]
            if not removed or len(removed) > max_chars:
                break
            return BackedUp(ids[:-k], removed)
    return BackedUp(ids, "")
