"""A small draft model sharing the target's vocabulary, with its own KV cache.

The cache is kept between proposals and rolled back by comparing the sequence the engine passes
in with the tokens the cache holds: rejected draft tokens are cropped off, accepted ones are
already there, and only the target's correction token has to be fed. With sessions (documents),
each keeps its own cache in a ``PrefixCache``, so switching documents doesn't re-feed a prompt.

The draft's output layer may be another size than the target's over the same tokenizer (Qwen2.5-Coder
0.5B has fewer rows than 7B, which it drafts for): its logits are fitted to the target's width
before a token is chosen, so it never proposes an id the target has no row for, and its q rows
are the target's width, with probability 0 where the draft has no row. Ids the target writes that
the draft has no embedding for are fed to it clamped: it drafts worse after them, never wrongly.
A GGUF draft on the CPU computes only its output layer's first rows, the common tokens
(``DraftOutputLayer``, loaded with ``draft=True``): the rest get probability 0 the same way.

A cold prompt is fed only as far as its last ``window`` tokens: what a draft needs is the text
near the cursor, and feeding a whole prompt cost the draft model more time than a completion's
drafts saved. The cache then starts inside the sequences the engine passes in (``_offset``); a
sequence that leaves more than a window to feed starts a fresh window, and a window is never
parked as a document's cache (its tokens are no prompt's prefix). Only the target's pass decides
what is written, so a draft's context changes its acceptance, never the output.

A draft runs only as far as its confidence pays (``confident``), as the draft head's does and as
EAGLE-2 and transformers' assisted generation size drafts: before each token, the chance that it
and every token before it are kept (greedy: the draft's probability for its best token, which on
real code tracks agreement with the target closely) is weighed against the row it adds to the
verify pass and the draft step that gives it. A fixed length from the average acceptance drafted
a token the 0.5B was unsure of as readily as one it was sure of, at a third of a target step each.
It is decided before each draw, so a sampled draft's q stays the distribution its token came from.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from speculative_complete.decoding.cost_model import CostModel, timed_ema
from speculative_complete.decoding.drafter_interface import Draft, Drafter
from speculative_complete.decoding.drafters.length import AcceptanceStats
from speculative_complete.decoding.kv_cache import PrefixCache, common_prefix_length
from speculative_complete.decoding.models.loading import LoadedModel
from speculative_complete.decoding.verify import SamplingParams, sample, sampling_probs


class ModelDrafter(Drafter):
    name = "model"
    WINDOW = 128  # the most tokens fed before a draft: a cold prompt's last ones (module docstring)

    def __init__(
        self,
        draft: LoadedModel,
        max_draft: int = 8,
        cost: CostModel | None = None,
        session_cache_bytes: int = 0,
        target_vocab: int | None = None,
        window: int | None = None,
    ) -> None:
        self.draft = draft
        self.window = window or self.WINDOW
        # The target's output size: the ids it can verify, and the width of q (None: the draft's).
        self.target_vocab = int(target_vocab or draft.vocab_size)
        self.max_draft = max_draft
        self.cost = cost or CostModel.for_device(draft.device.type)
        self.stats = AcceptanceStats(priors={0: 0.6})
        self.step_ms: float | None = None  # EMA of one single-token draft step
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None
        self._cache: Any = None  # the draft's ModelPass cache
        self._cached: list[int] = []  # the tokens whose keys and values the cache holds
        self._offset = 0  # where ``_cached`` starts in the sequences the engine passes in
        self._session: str | None = None
        self._ticket: int | None = None  # the live session's loan from ``sessions``
        self.sessions = PrefixCache(session_cache_bytes)  # parked caches of other sessions

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        session: str | None = None,
    ) -> None:
        self._sampling, self._generator = sampling, generator
        if self.step_ms is None and prompt:
            self._time_step(prompt[-1])
        if session is None or session == self._session:
            return
        if self._session is not None and self._cache is not None:
            # A window (``_offset`` > 0) is parked as nothing: its tokens are no prompt's prefix.
            held = self._cached if self._offset == 0 else []
            self.sessions.put(self._session, held, self._cache, ticket=self._ticket)
        self._session = session
        borrowed = self.sessions.take(session, prompt)
        self._cache, self._cached = borrowed.cache, list(prompt[: borrowed.reused])
        self._offset, self._ticket = 0, borrowed.ticket

    @torch.inference_mode()
    def _time_step(self, token: int) -> None:
        """Time a step on a scratch cache (the second: the first allocates), once: whether a
        prompt is worth feeding to the draft model depends on it before it has drafted anything."""
        cache = self.draft.forward.new_cache()
        self.draft.forward(self._feedable([token]), cache, keep=1)
        started = time.perf_counter()
        self.draft.forward(self._feedable([token]), cache, keep=1)
        self.step_ms = (time.perf_counter() - started) * 1000

    def forget(self, session: str) -> None:
        """The session's document was closed: its cache, parked or live, is dropped."""
        self.sessions.drop(session)
        if session == self._session:
            self._session, self._cache, self._cached, self._ticket = None, None, [], None
            self._offset = 0

    @property
    def relative_cost(self) -> float:
        """One draft step in target single-token steps; a guess until both have been timed."""
        target = self.cost.step_ms
        return self.step_ms / target if (self.step_ms and target) else 0.5

    def cached_tokens(self) -> list[int]:
        return list(self._cached)

    def tokens_behind(self, tokens: Sequence[int]) -> int:
        """How many tokens of ``tokens`` would have to be fed before drafting could start."""
        offset, keep = self._plan(tokens)
        return len(tokens) - offset - keep

    def _plan(self, tokens: Sequence[int]) -> tuple[int, int]:
        """Where in ``tokens`` the cache would start, and how many of its tokens it keeps: the
        cache as it is where it agrees with ``tokens`` and leaves at most ``window`` tokens to feed
        (always short of the last token, whose logits are wanted), else none of it, a fresh cache
        over the last ``window`` tokens."""
        view = tokens[self._offset :]
        keep = min(common_prefix_length(self._cached, view), len(view) - 1) if self._cache is not None else 0
        if keep > 0 and len(view) - keep <= self.window:
            return self._offset, keep
        return max(0, len(tokens) - self.window), 0

    def _forward(self, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens``; the next-token logits over the target's ids (``_fit``)."""
        logits = self.draft.forward(self._feedable(tokens), self._cache, keep=1)
        self._cached.extend(tokens)
        return self._fit(logits[-1])

    def _feedable(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` with ids past the draft's table clamped to its last row: the cache then
        depends on the token sequence alone, so rolling it back by comparing tokens stays right."""
        last = self.draft.vocab_size - 1
        return [min(int(token), last) for token in tokens]

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` cut or padded to the target's width: the draft's ids the target lacks are
        dropped before choosing, and the ids the draft lacks get -inf (probability 0 in q)."""
        width = logits.shape[-1]
        if width >= self.target_vocab:
            return logits[..., : self.target_vocab]
        pad = logits.new_full((*logits.shape[:-1], self.target_vocab - width), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _sync(self, tokens: Sequence[int]) -> torch.Tensor:
        """Roll the cache back to the longest common prefix and feed the rest, or start a window
        (``_plan``); next-token logits."""
        offset, keep = self._plan(tokens)
        if keep == 0:
            self._cache, self._cached, self._offset = self.draft.forward.new_cache(), [], offset
        elif keep < len(self._cached):
            self._cache.crop(keep - len(self._cached))
            del self._cached[keep:]
        return self._forward(tokens[self._offset + len(self._cached) :])

    @torch.inference_mode()
    def propose_exactly(self, tokens: Sequence[int], k: int, confident: bool = False) -> Draft:
        """Draft ``k`` tokens (fewer if the draft model ends the text; with ``confident``, only
        as many as are worth verifying and drafting, see the module's docstring)."""
        if k <= 0 or not tokens:
            return Draft(source=self.name)
        logits = self._sync(tokens)
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        eos = self.draft.end_token_ids
        chance = 1.0  # that every token drafted so far is kept
        for i in range(k):
            # Decided before the draw, as the head decides (its module's docstring): a sampled
            # token dropped for its own probability would bias the output.
            q = None if self._sampling.greedy else sampling_probs(logits, self._sampling)
            chance *= float(torch.softmax(logits, -1).max()) if q is None else float(q.square().sum())
            if confident and not self._worth(i, chance):
                break
            token = int(logits.argmax()) if q is None else sample(q, self._generator)
            drafted.append(token)
            if q is not None:
                rows.append(q)
            if i == k - 1 or token in eos:
                break
            if confident and not self._worth(i + 1, chance * self.stats.alpha(), self.relative_cost):
                break
            started = time.perf_counter()
            logits = self._forward([token])
            ms = (time.perf_counter() - started) * 1000
            self.step_ms = timed_ema(self.step_ms, ms)
        probs = torch.stack(rows) if rows else None
        return Draft(tokens=drafted, probs=probs, source=self.name)

    def _worth(self, drafted: int, chance: float, step: float = 0.0) -> bool:
        """Whether a token drafted after ``drafted`` others, kept with probability ``chance``
        (all before it kept too), saves more than it costs in target steps: a wider verify pass,
        and ``step``, the draft step that would give it."""
        return chance > self.cost.added_row(drafted) + step

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        return self.propose_exactly(tokens, min(max_len, self.max_draft), confident=True)

    def observe(self, draft: Draft, accepted: int) -> None:
        self.stats.update(0, accepted, len(draft))
