"""Token healing: back the prompt up over its last token, then make the output start with it.

A prompt that ends mid-word (``_iterencode_dic``) or in indentation (``"\\n    "``) ends on a token
the model rarely saw in that position: BPE glues a space to the word after it and a newline to
the indentation after it, so in training text ``"\\n    "`` is mostly followed by the rest of a
longer whitespace token or by a word token that starts with a space. Conditioned on the odd
boundary, the model slips (SmolLM2 writes ``(o,`` after ``_iterencode_dic`` and drops the ``t``,
and answers an empty line after indentation). Healing removes the last token(s) from the prompt
and constrains the first generated token(s) to be consistent with the removed text, so the model
picks the tokenization itself (``dict``, ``"\\n   " + " return"``).

The index and the constraint are pure and work on bytes: a token's bytes are what it contributes to the
decoded text, which keeps multi-byte characters split across tokens exact. The table of every
token's bytes is built once per tokenizer (49k entries for SmolLM2, 262k for Gemma 3), not per
request; ``HealingIndex`` answers "which tokens may come next" from it in time proportional to
the answer, with a small cache because the same remaining texts (a space, a newline with
indentation) come up again and again. ``Healing`` is the constraint as the decoding loop
consults it: masks for a verify pass's rows, drafts cut where it refuses them, and where it
overrode the target's own choice; ``chain_fits`` and ``asked_fits`` tell when a cached
continuation is what healed decoding would choose.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the prompt builder backs prompts up here on a remote server too: no torch
    import torch

    from speculative_complete.decoding.drafter_interface import Draft
    from speculative_complete.decoding.kv_cache import Chain

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


class Healing:
    """Token healing as a constraint the loop consults: while the required text is owed, only
    tokens that continue it may be chosen.

    Under greedy decoding drafts still run while text is owed (the keystroke replay asks with a
    healed word at most keystrokes, and a draft riding on the prefill was lost to every one of
    them): a draft is cut before its first token the constraint would refuse (greedy acceptance
    rejects it anyway), and each row of the verify pass is masked for the constraint as it stands
    after the draft tokens before that row, so what is accepted is what one masked step at a
    time would choose. A sampled draft keeps off owed text: cutting it where its tokens are
    refused would change the distribution the target's tokens are drawn from.

    ``deviated`` is the last generated index where the constraint overrode the target's unmasked
    greedy choice: tokens up to there are not the target's own chain and must never be served as
    one. The index tensors of allowed tokens are cached per remaining text (the token after a
    healed space allows most of the vocabulary).
    """

    def __init__(self, constraint: PrefixConstraint, masks: dict[bytes, torch.Tensor]) -> None:
        self.constraint = constraint
        self.deviated = -1
        self._masks = masks

    @property
    def active(self) -> bool:
        return self.constraint.active

    @property
    def failed(self) -> bool:
        return self.constraint.failed

    def allowed_draft(self, draft: Draft) -> Draft:
        """``draft`` (greedy) cut before its first token the constraint refuses, or after which
        it would allow nothing (healing fails there, which only row 0 of a pass reports)."""
        kept = self.constraint.allowed_length(draft.tokens, stuck_ends=True)
        return draft if kept == len(draft) else replace(draft, tokens=draft.tokens[:kept], probs=None)

    def allowed_length(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, the constraint allows in turn (all of them once
        the text is written)."""
        return self.constraint.allowed_length(tokens)

    def allowed_after(self, tokens: Sequence[int]) -> tuple[bytes, tuple[int, ...]] | None:
        """What the constraint allows after ``tokens`` (allowed ones): the text still owed (a key
        for caches) and the sorted token ids; None once the text is written."""
        probe = copy.copy(self.constraint)
        for token in tokens:
            probe.advance(token)
        return (probe.key, probe.allowed()) if probe.active else None

    def masks(self, draft: Sequence[int], device: torch.device) -> list[torch.Tensor]:
        """For the rows of a pass over the newest token and ``draft`` (a row per draft token and
        one more): the ids allowed at each row while the text is owed after the draft tokens
        before it. The list ends at the first row where the text is paid or nothing is allowed
        (an empty list while the text is owed: nothing can continue it)."""
        probe = copy.copy(self.constraint)
        out: list[torch.Tensor] = []
        for row in range(len(draft) + 1):
            if not probe.active:
                break
            index = self._allowed(probe, device)
            if index is None:
                break
            out.append(index)
            if row < len(draft):
                probe.advance(draft[row])
        return out

    def constrain(
        self, logits: torch.Tensor, masks: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[int]]:
        """``logits`` (a row per draft token and one more) with each row masked by ``masks``
        (``masks`` for the same draft), and those rows' unmasked argmax (the rows after the text
        is paid are left alone). Nothing allowed at row 0: marked failed, left unmasked."""
        if not masks and self.constraint.active:
            self.constraint.failed = True
        masked, unmasked = logits.clone(), []
        for row, index in enumerate(masks):
            unmasked.append(int(logits[row].argmax()))
            masked[row] = float("-inf")
            masked[row, index] = logits[row, index]
        return masked, unmasked

    def _allowed(self, probe: PrefixConstraint, device: torch.device) -> torch.Tensor | None:
        index = self._masks.get(probe.key)
        if index is None or index.device != device:
            allowed = probe.allowed()
            if not allowed:
                return None
            import torch  # only a local engine gets here (see the imports)

            index = torch.tensor(allowed, dtype=torch.long, device=device)
            if len(self._masks) > 64:
                self._masks.clear()
            self._masks[probe.key] = index
        return index

    def chose(self, position: int, token: int, unmasked: int | None) -> None:
        """``token`` was generated at ``position`` where the unmasked greedy choice was ``unmasked``."""
        if unmasked is not None and token != unmasked:
            self.deviated = position

    def advance(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.constraint.advance(token)


def chain_fits(index: HealingIndex, chain: Chain | None, prompt: list[int], required: str) -> bool:
    """Whether a known greedy continuation of ``prompt`` (if ``chain`` offers one) is also what
    healed decoding would choose: it is, exactly when each of its tokens spent while the
    required text is owed is an allowed one (the masked argmax of a set that holds the unmasked
    argmax is that argmax)."""
    if (
        chain is None
        or chain.greedy_from is None
        or len(chain.tokens) <= len(prompt)
        or chain.tokens[: len(prompt)] != prompt
    ):
        return True  # no known continuation will be offered
    rest = chain.tokens[len(prompt) :]
    return PrefixConstraint(index, required).allowed_length(rest) == len(rest)


def asked_fits(chain: Chain | None, prompt: list[int], required: str) -> bool:
    """Whether the tokens the last request at this very prompt was answered with (healed, so not
    on the greedy chain) are what healing ``required`` would choose now. That is the user typing
    on inside the healed word (at ``self.le`` the prompt ends at ``self`` and owes ``.le``; at
    ``self.lev`` it is the same prompt owing ``.lev``): where ``required`` extends the text that
    request owed, each set of tokens it allows is within the set that request's choice was the
    best of, so where that choice is allowed it is the best of this set too. The keystroke replay
    spent a large share of its target passes decoding such prompts again. Asked only where
    ``chain_fits`` held: it has checked these very tokens against ``required``."""
    if chain is None or chain.asked is None or chain.greedy_from is None:
        return False
    asked = chain.asked
    return (
        asked.prompt_tokens == len(prompt) < len(chain.tokens)
        and required.startswith(asked.owed)
        and chain.tokens[: len(prompt)] == prompt
    )
