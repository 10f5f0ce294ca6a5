"""What the context builder needs from a model's tokenizer, behind one small object.

Prompt building counts real tokens, so it runs where the tokenizer lives: on the decode worker
thread, never on the event loop. Tests build a ``Tokens`` from any Hugging Face tokenizer (one
with fill-in-the-middle tokens added, say) without loading a model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Tokens:
    encode: Callable[[str], list[int]]  # text -> ids, no BOS/EOS
    decode: Callable[[Sequence[int]], str]  # ids -> text, special tokens kept
    vocab: Callable[[], Mapping[str, int]]  # every token's piece -> id (FIM markers are looked up here)
    healing_index: Any = (
        None  # speculative_complete.decoding.engine.healing.HealingIndex: lets healing skip special tokens
    )
    # Where encoding is a round trip (a remote engine's /tokenize), the counts that only choose
    # which rows fit come from this estimate; the prompt's own ids still come from ``encode``.
    estimate: Callable[[str], int] | None = None
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    _ids: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def count(self, text: str) -> int:
        """Tokens in ``text``, memoized for the current request's repeated pieces."""
        if self.estimate is not None:
            return self.estimate(text) if text else 0
        n = self._counts.get(text)
        if n is None:
            if len(self._counts) > 4096:
                self._counts.clear()
            n = self._counts[text] = len(self.encode(text)) if text else 0
        return n

    def ids(self, text: str) -> list[int]:
        """``encode(text)``, memoized across requests: a FIM prompt's suffix is the same text at
        every keystroke on a line, and fitting it to its share encodes it a line shorter at a time."""
        found = self._ids.get(text)
        if found is None:
            if len(self._ids) > 256:
                self._ids.clear()
            found = self._ids[text] = tuple(self.encode(text))
        return list(found)

    def special_id(self, marker: str) -> int | None:
        """The id of a marker token such as ``<fim_prefix>`` (or SentencePiece's ``▁<PRE>``)."""
        vocab = self.vocab()
        for name in (marker, "\u2581" + marker):
            if name in vocab:
                return int(vocab[name])
        return None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, healing_index: Any = None) -> Tokens:
        vocab = functools.cache(lambda: dict(tokenizer.get_vocab()))
        return cls(
            encode=lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
            decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
            vocab=vocab,
            healing_index=healing_index,
        )

    @classmethod
    def for_engine(cls, engine: Any) -> Tokens:
        """The engine's own encode/decode (the ids it is fed must be the ones counted here)."""
        tokenizer = engine.target.tokenizer
        vocab = functools.cache(lambda: dict(tokenizer.get_vocab()))
        return cls(
            encode=engine.encode, decode=engine.decode, vocab=vocab, healing_index=engine.healing_index
        )
