"""The remote model's tokenizer for prompt building: exact ids from the engine, estimates elsewhere.

Token budgets and healing need the model's own tokenizer, and for a remote model that lives on
the engine (``/tokenize``, ``/detokenize``). A round trip per count would be far too many (the
prompt builder weighs every row), so the work is split:

- ``count`` (which rows fit) is an estimate in characters per token, calibrated once on the
  engine's own answers for this session's text;
- ``encode`` (the prompt's ids, checked against the budget) asks the engine, remembering recent
  answers (consecutive keystrokes re-encode the same text; a cursor that moves back, too);
- ``decode`` (healing's backing up) joins the pieces llama.cpp sends with each ``/tokenize``, and
  asks ``/detokenize`` only for ids it has not seen.

Every call gives up at the request's deadline: ``TokenizerUnavailable`` then tells the runtime to
build this prompt by characters and send it unhealed. An engine without ``/tokenize`` (TGI,
Ollama) is asked once; its prompts are built by characters from then on (shown in the stats).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from speculative_complete.lsp_server.context import Tokens
from speculative_complete.lsp_server.remote.engine import RemoteEngine

CHARS_PER_TOKEN = 3.0  # before the engine has told us: code runs 3-4; fewer keeps under budget
ENCODE_CACHE = 64
PIECES_MAX = 1 << 17  # ids whose bytes are remembered (a vocabulary is 32k-262k)
CALL_TIMEOUT_S = 2.0  # one tokenizer call, at most, when the request has more time than that


class TokenizerUnavailable(Exception):
    """No ids from the engine for this prompt (failed, too slow, or no such endpoint)."""


@dataclass
class Calibration:
    """Characters per token of the first texts the engine encoded, then fixed.

    Fixed, because the estimate chooses the prompt's rows: a ratio that drifted from keystroke to
    keystroke would move the prompt's start, and every prompt cache (the engine's too) needs a
    stable start."""

    chars: int = 0
    tokens: int = 0
    fixed: float | None = None

    def add(self, text: str, ids: Sequence[int]) -> None:
        if self.fixed is not None or len(text) < 64 or not ids:  # short pieces say little
            return
        self.chars, self.tokens = self.chars + len(text), self.tokens + len(ids)
        if self.tokens >= 256:
            self.fixed = max(1.0, self.chars / self.tokens)

    @property
    def ratio(self) -> float:
        return self.fixed if self.fixed is not None else CHARS_PER_TOKEN


class RemoteTokenizer:
    """One per runtime; used on the worker thread (a lock guards it anyway: it is cheap)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine
        self.calibration = Calibration()
        self._encoded: OrderedDict[str, list[int]] = OrderedDict()
        self._pieces: dict[int, bytes] = {}
        self._lock = threading.Lock()

    @property
    def supported(self) -> bool | None:
        """False once the engine showed it has no ``/tokenize``; None before it was asked."""
        return self.engine.stats.tokenize_supported

    def estimate(self, text: str) -> int:
        return math.ceil(len(text) / self.calibration.ratio) if text else 0

    def tokens(self, deadline: float | None) -> Tokens:
        """A ``Tokens`` for one prompt, whose calls give up at ``deadline``."""
        return Tokens(
            encode=lambda text: self.encode(text, deadline),
            decode=lambda ids: self.decode(ids, deadline),
            vocab=dict,  # no vocabulary over HTTP: no FIM template of our own (the engine's FIM is used)
            estimate=self.estimate,
        )

    def characters(self) -> Tokens:
        """Budgets in characters, for an engine without a tokenizer: ids are only a length
        (the prompt is sent as text), and nothing is decoded (no healing)."""

        def unavailable(ids: Sequence[int]) -> str:
            raise TokenizerUnavailable("no tokenizer: prompts are not healed")

        return Tokens(
            encode=lambda text: [0] * self.estimate(text),
            decode=unavailable,
            vocab=dict,
            estimate=self.estimate,
        )

    def encode(self, text: str, deadline: float | None) -> list[int]:
        if not text:
            return []
        with self._lock:
            hit = self._encoded.get(text)
            if hit is not None:
                self._encoded.move_to_end(text)
                return list(hit)
        answer = self.engine.tokenize_pieces(text, _call_deadline(deadline))
        if answer is None:
            raise TokenizerUnavailable(self.engine.stats.last_error or "the engine did not tokenize")
        ids, pieces = answer
        with self._lock:
            self.calibration.add(text, ids)
            if len(self._pieces) + len(pieces) > PIECES_MAX:
                self._pieces.clear()
            self._pieces.update(pieces)
            self._encoded[text] = ids
            while len(self._encoded) > ENCODE_CACHE:
                self._encoded.popitem(last=False)
        return list(ids)

    def decode(self, ids: Sequence[int], deadline: float | None) -> str:
        with self._lock:
            known = [self._pieces.get(i) for i in ids]
        if all(piece is not None for piece in known):
            return b"".join(known).decode("utf-8", "replace")  # type: ignore[arg-type]
        text = self.engine.detokenize(list(ids), _call_deadline(deadline))
        if text is None:
            raise TokenizerUnavailable("the engine did not detokenize")
        return text


def _call_deadline(deadline: float | None) -> float:
    """The request's deadline, but never more than ``CALL_TIMEOUT_S`` for one call."""
    cap = time.monotonic() + CALL_TIMEOUT_S
    return cap if deadline is None else min(deadline, cap)
