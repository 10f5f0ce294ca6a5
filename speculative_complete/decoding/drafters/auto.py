"""Choose per step between the n-gram source, the draft head, the draft model, and not speculating.

An n-gram match is free to find; the draft head costs a few hundredths of a target step per
token, the draft model a forward pass of its own. Each candidate
is scored by its expected speed-up (see ``length.py``) from its own acceptance history and the
measured verification cost; the best one is used only if that speed-up exceeds 1, because a
rejected draft costs more than the plain step it replaces. Buckets that are switched off are
probed now and then, so a source whose quality improves is noticed again. The head, once
chosen, drafts only as far as its own confidence pays (``HeadDrafter._worth``); where that is not
even one token, the n-gram match it was weighed against is drafted instead of nothing.

While token healing still owes typed text (greedy only), an n-gram match is weighed only as far
as the text allows it: the engine would cut it there anyway (``Healing.allowed_draft``), and a
match cut to nothing must not win over the head, which drafts among what the text allows.

A draft model that has not read the text yet (a new prompt) must first be fed it (at most its
``window`` of last tokens), a cost no single draft repays and one that a generation may never
repay if it ends soon. It is paid as a ski rental is: each pass the draft model would have won
were it caught up adds what it would have saved to a tally, and once the tally reaches the
catch-up's cost the draft model is fed and used, so it pays about twice at most what hindsight
would. The tally outlives a request: a document's short completions warm the draft model too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.drafter_interface import Draft, Drafter, OwedText
from speculative_complete.decoding.drafters.head import HeadDrafter
from speculative_complete.decoding.drafters.length import best_draft_length
from speculative_complete.decoding.drafters.model import ModelDrafter
from speculative_complete.decoding.drafters.ngram import Match, NgramDrafter
from speculative_complete.decoding.verify import SamplingParams


class AutoDrafter(Drafter):
    name = "auto"
    MIN_GAIN = 1.05  # demand a margin: the estimate is noisy and a wasted pass is not free
    PROBE_EVERY = 32  # skipped opportunities between exploratory drafts of a gated-off source

    def __init__(
        self,
        ngram: NgramDrafter,
        model: ModelDrafter | None = None,
        cost: CostModel | None = None,
        head: HeadDrafter | None = None,
    ) -> None:
        self.cost = cost or ngram.cost
        self.ngram, self.model, self.head = ngram, model, head
        for drafter in (ngram, model, head):
            if drafter is not None:
                drafter.cost = self.cost
        self._skipped: dict[str, int] = {}
        self._owed: OwedText | None = None
        self._missed = 0.0  # target steps the draft model would have saved, had it been caught up

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        session: str | None = None,
    ) -> None:
        for drafter in self._drafters():
            drafter.begin(prompt, sampling, generator, session)

    def forget(self, session: str) -> None:
        for drafter in self._drafters():
            drafter.forget(session)

    def document_sources(self) -> NgramDrafter:
        return self.ngram

    def attach(self, target_cache) -> None:
        if self.head is not None:
            self.head.attach(target_cache)

    def steer(self, owed: OwedText | None) -> None:
        """What token healing allows (``HeadDrafter.steer``): the head drafts among it, and an
        n-gram match counts only as far as it goes along it."""
        self._owed = owed
        if self.head is not None:
            self.head.steer(owed)

    def end_at(self, ends: Callable[[int], bool]) -> None:
        if self.head is not None:
            self.head.end_at(ends)

    def _allowed_match(self, match: Match | None) -> Match | None:
        """``match`` cut before its first token healing refuses; None where that leaves nothing."""
        if match is None or self._owed is None:
            return match
        kept = self._owed.allowed_length(match.tokens)
        if kept == len(match.tokens):
            return match
        return dataclasses.replace(match, tokens=match.tokens[:kept]) if kept else None

    def _drafters(self) -> list:
        return [d for d in (self.ngram, self.model, self.head) if d is not None]

    def _probe(self, key: str) -> bool:
        self._skipped[key] = self._skipped.get(key, 0) + 1
        if self._skipped[key] >= self.PROBE_EVERY:
            self._skipped[key] = 0
            return True
        return False

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        limit = min(max_len, self.ngram.max_draft)
        candidates: list[tuple[float, str, int]] = []
        match = self._allowed_match(self.ngram.lookup(tokens, limit))
        if match is not None:
            stats = self.ngram.stats_for(match.source)
            k, gain = best_draft_length(stats.alpha(match.length), len(match.tokens), self.cost)
            key = f"ngram-{'corpus' if match.source == 'corpus' else 'view'}{stats.bucket(match.length)}"
            if gain >= self.MIN_GAIN or self._probe(key):
                candidates.append((gain, "ngram", k))
        if self.model is not None and max_len > 0:
            model = self._model_candidate(tokens, max_len, max([1.0] + [c[0] for c in candidates]))
            if model is not None:
                candidates.append(model)
        if self.head is not None and max_len > 0 and self.head.usable(tokens):
            k, gain = best_draft_length(
                self.head.stats.alpha(),
                min(max_len, self.head.max_draft),
                self.cost,
                draft_cost=self.head.relative_cost,
            )
            if gain >= self.MIN_GAIN or self._probe("head"):
                candidates.append((gain, "head", k))
        if not candidates:
            return Draft(source=self.name)
        _, source, k = max(candidates)
        if source == "head":  # as many tokens as the head is confident enough of
            assert self.head is not None
            draft = self.head.propose_exactly(tokens, min(max_len, self.head.max_draft), self.head.confident)
            ngram = [c for c in candidates if c[1] == "ngram"]
            if draft.tokens or not ngram:
                return draft
            source, k = "ngram", ngram[0][2]  # the head is unsure even of its first token
        if source == "ngram":
            assert match is not None
            return Draft(
                tokens=match.tokens[:k], source="ngram", match_length=match.length, origin=match.source
            )
        assert self.model is not None
        return self.model.propose_exactly(tokens, min(max_len, self.model.max_draft), confident=True)

    def _model_candidate(
        self, tokens: Sequence[int], max_len: int, rival: float
    ) -> tuple[float, str, int] | None:
        """The draft model's (gain, "model", k), or None. Its first forward feeds the tokens it
        is behind (the target's last token, those a pass accepted, or a new prompt's) and gives
        its first draft token, so only what feeding them costs beyond one step is extra. A small
        extra is charged to this pass; one no pass repays is paid once the tally of what the
        model would have saved over ``rival`` (the best other gain, 1: plain steps) reaches it
        (module docstring)."""
        assert self.model is not None
        drafting = self.model.relative_cost
        k, gain = best_draft_length(
            self.model.stats.alpha(), min(max_len, self.model.max_draft), self.cost, draft_cost=drafting
        )
        extra = drafting * max(0.0, self.cost.relative(self.model.tokens_behind(tokens)) - 1.0)
        pass_cost = self.cost.verify(k) + k * drafting
        charged = gain * pass_cost / (pass_cost + extra)
        if charged >= self.MIN_GAIN:
            return charged, "model", k
        if gain > rival:
            self._missed += 1.0 / rival - 1.0 / gain  # target steps a token, about a token a pass
            if self._missed >= extra:
                self._missed = 0.0
                return gain, "model", k  # it wins this pass: the catch-up is paid, its cost sunk
        if extra == 0.0 and self._probe("model"):
            return charged, "model", k
        return None

    def observe(self, draft: Draft, accepted: int) -> None:
        if draft.source == "ngram":
            self.ngram.observe(draft, accepted)
        elif draft.source == "model" and self.model is not None:
            self.model.observe(draft, accepted)
        elif draft.source == "head" and self.head is not None:
            self.head.observe(draft, accepted)
