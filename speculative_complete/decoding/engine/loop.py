"""The speculative decoding loop: prefill, draft, verify in one target pass, accept, roll back.

One clear loop in the style of gpt-fast's ``generate.py``. The target's KV cache always holds
every token except the newest, which is fed together with the next draft; after acceptance the
cache is cropped to drop the rejected draft tokens. Between any two target passes the loop
polls a cancel check, so a cancel (a new keystroke, a time budget) takes effect within one step
and returns what was decoded so far.

With a ``PrefixCache`` and a ``cache_key`` (the server passes the document), the cache a
generation leaves behind serves the next one on that key: only the prompt tokens after the
longest common prefix are prefilled. The prefill runs in chunks with the cancel check between
them, each sized by measured time to take about as long wherever it runs
(``speculative_complete.decoding.engine.pacing``), so a superseded request stops within one short
chunk and what it did prefill still warms the cache for the next keystroke. A caller that must
answer early (``GenerationConfig.answer_due``) gets the whole lines decoded so far, and the cache
keeps the rest of what was decoded.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from speculative_complete.decoding.cost_model import CostModel
from speculative_complete.decoding.drafter_interface import Draft, Drafter
from speculative_complete.decoding.engine.healing import (
    Healing,
    HealingIndex,
    PrefixConstraint,
    asked_fits,
    chain_fits,
)
from speculative_complete.decoding.engine.pacing import PREFILL_PASS_MS, PrefillPace
from speculative_complete.decoding.engine.stops import Cut, EndingTokens, cut_at_stop, whole_lines
from speculative_complete.decoding.kv_cache import Asked, Borrowed, PrefixCache
from speculative_complete.decoding.models.loading import LoadedModel
from speculative_complete.decoding.results import DrafterStats, GenerationResult, GenerationStats
from speculative_complete.decoding.verify import (
    Acceptance,
    SamplingParams,
    greedy_accept,
    sample,
    sampling_probs,
    speculative_accept,
)

log = logging.getLogger(__name__)

CancelCheck = Callable[[], bool] | threading.Event | None


@dataclass
class GenerationConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_at_newline: bool = False  # end of line: the text stops before the first "\n"
    max_draft_tokens: int = 16  # a cap: drafters pick the length from acceptance and verify cost
    prefill_chunk: int = 256  # the most tokens per prefill pass; the cancel check runs between passes
    # How long a prefill pass should take (``speculative_complete.decoding.engine.pacing``): passes
    # are sized from the measured time per token. None: every pass is ``prefill_chunk`` tokens (a
    # benchmark's one-pass prefill).
    prefill_ms: float | None = PREFILL_PASS_MS
    reuse_continuation: bool = True  # greedy: answer from a cached greedy chain the prompt lies on
    # Token healing: the generated text must begin with this (the text backed up from the prompt's
    # end). ``text`` and every stop apply to what follows it; ``token_ids`` stay all generated ids.
    required_prefix: str = ""
    # A stop decided by the caller: given the text so far (after ``required_prefix``), the index
    # to cut it at, or None to go on (e.g. where a multi-line suggestion's block ends).
    stop_when: Callable[[str], int | None] | None = None
    # Decoding ahead of the user (prefetch): the cache keeps its record of what was last asked,
    # which tells how far ahead of the user's text its chain already reaches.
    ahead: bool = False
    # Polled between passes like the cancel check, with how long the next pass is expected to take
    # (ms): once it says an answer is due before that pass would end (a first-answer budget runs
    # out), a text that holds a whole line ends after its last whole line, with the stop reason
    # "partial". Every token decoded stays on the cache's greedy chain, so the rest can be decoded
    # ahead and the next request answered from it. For multi-line suggestions: a single line has
    # no whole line before its end.
    answer_due: Callable[[float], bool] | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def stops(self) -> tuple[str, ...]:
        return tuple(s for s in self.stop_strings if s) + (("\n",) if self.stop_at_newline else ())


@dataclass
class Run:
    """One generation's state, read and updated by the loop's steps."""

    prompt: list[int]
    config: GenerationConfig
    drafter: Drafter | None
    cancel: CancelCheck
    stats: GenerationStats
    generator: torch.Generator | None  # sampling only
    healing: Healing | None
    eos: frozenset[int]  # the tokens that end a generation (the target's), looked up once per generation
    generated: list[int] = field(default_factory=list)
    cache: Any = None

    @property
    def sampling(self) -> SamplingParams:
        return self.config.sampling


def is_cancelled(cancel: CancelCheck) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


class SpeculativeEngine:
    """Decodes with one target model and any drafter; the drafter may change per call.

    Not thread-safe: one generation at a time (the server runs them on one worker thread).
    """

    def __init__(
        self, target: LoadedModel, cost: CostModel | None = None, prefix_cache: PrefixCache | None = None
    ) -> None:
        self.target = target
        prior = target.forward.cost_prior
        self.cost = cost or CostModel.for_device(target.device.type, prior)
        self.prefix_cache = prefix_cache
        self.pace = PrefillPace()  # prefill passes sized by their measured time per token
        self._healing_masks: dict[bytes, torch.Tensor] = {}
        self._endings: dict[tuple[str, ...], EndingTokens] = {}  # by a generation's stops

    @functools.cached_property
    def healing_index(self) -> HealingIndex:
        """Every token's bytes, for token healing: built once per engine, at load."""
        return HealingIndex.for_tokenizer(self.target.tokenizer, self.target.vocab_size)

    # -- helpers ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.target.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: Sequence[int]) -> str:
        return self.target.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def _forward(
        self,
        tokens: Sequence[int],
        cache: Any,
        greedy: bool,
        keep: int = 0,
        allowed: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits for the last ``keep`` fed positions (0: all): the output layer over a 49k
        vocabulary is a fifth of a prefill's cost, and a prefill needs only its last rows.
        ``allowed``: what healing allows at the first rows (``Healing.masks``), so that the
        greedy choice among it is exact; ``greedy``: only greedy choices are read (``ModelPass``)."""
        return self.target.forward(tokens, cache, keep, allowed or None, greedy_only=greedy)

    def _masks(self, healing: Healing | None, draft: Draft) -> list[torch.Tensor] | None:
        """What healing allows at each row of the pass that verifies ``draft``, while it owes text."""
        if healing is None or not healing.active:
            return None
        return healing.masks(draft.tokens, self.target.device)

    def _fit_context(self, prompt: list[int], config: GenerationConfig, stats: GenerationStats) -> list[int]:
        room = self.target.max_context - config.max_new_tokens - config.max_draft_tokens - 1
        room = max(room, 1)
        if len(prompt) > room:
            stats.trimmed_tokens = len(prompt) - room
            log.warning(
                "prompt of %d tokens exceeds the context; dropped the first %d",
                len(prompt),
                stats.trimmed_tokens,
            )
            prompt = prompt[-room:]
        if not prompt:
            bos = getattr(self.target.tokenizer, "bos_token_id", None)
            if bos is None:
                bos = next(iter(sorted(self.target.end_token_ids)), 0)
            prompt = [int(bos)]
        return prompt

    def _prefill(
        self,
        prompt: list[int],
        cache_key: str | None,
        config: GenerationConfig,
        cancel: CancelCheck,
        stats: GenerationStats,
        continuation: bool = True,
        draft_for: Callable[[Any], Draft] | None = None,
        asked: bool = False,
        healing: Healing | None = None,
    ) -> tuple[Borrowed, torch.Tensor | None, Draft]:
        """The cache holding ``prompt`` (and a draft after it), and the logits from the prompt's
        last token on: one row, plus one per draft token.

        The last chunk carries a draft from ``draft_for(cache)`` when given: verifying it there costs a
        few more rows of a pass that runs anyway, which on a long prompt is nearly free, and where
        the prompt already holds the line being written the whole line can come out of the prefill.
        No logits when the continuation is already known (``borrowed.known``: no pass at all) or
        when cancelled midway (the cache then holds the chunks done and goes back to the store).
        """
        store = self.prefix_cache if cache_key is not None else None
        continuation = continuation and config.sampling.greedy and config.reuse_continuation
        borrowed = (
            store.take(cache_key, prompt, continuation=continuation, asked=asked)
            if store is not None
            else Borrowed(None)
        )
        stats.reused_tokens = borrowed.reused
        if borrowed.known:
            return borrowed, None, Draft()
        if borrowed.cache is None:
            borrowed.cache = self.target.forward.new_cache()
        done = borrowed.reused
        while True:
            end = self._chunk_end(len(prompt), done, config)
            draft = Draft()
            if end == len(prompt) and draft_for is not None:
                with self.cost.riding(end - done):
                    draft = draft_for(borrowed.cache)
            allowed = self._masks(healing, draft) if end == len(prompt) else None
            logits = self._prefill_pass(
                prompt[done:end] + draft.tokens,
                borrowed.cache,
                len(draft) + 1,
                allowed,
                config.sampling.greedy,
            )
            done = end
            if done == len(prompt):
                return borrowed, logits, draft
            if is_cancelled(cancel):
                if store is not None:
                    store.put(cache_key, prompt[:done], borrowed.cache, ticket=borrowed.ticket)
                return borrowed, None, draft

    def _prefill_pass(
        self, tokens: list[int], cache: Any, keep: int, allowed: list[torch.Tensor] | None, greedy: bool
    ) -> torch.Tensor:
        """One prefill pass, timed: its time per token sizes the passes after it."""
        started = self.pace.clock()
        logits = self._forward(tokens, cache, greedy, keep, allowed)
        self.pace.record(len(tokens), (self.pace.clock() - started) * 1000)
        return logits

    def _chunk_end(self, total: int, done: int, config: GenerationConfig) -> int:
        """Where the next prefill pass over a prompt of ``total`` tokens, ``done`` of them in the
        cache, ends: after as many tokens as fit in ``config.prefill_ms`` (``PrefillPace``), at
        most ``prefill_chunk``. A remainder too short to be worth a pass of its own joins it."""
        most = max(1, config.prefill_chunk)
        if config.prefill_ms is None:
            return min(total, done + most)
        end = min(total, done + self.pace.tokens(config.prefill_ms, most))
        if total - done <= most and self.pace.joins(total - end, total - done):
            end = total
        return end

    def _reuse_fits(self, cache_key: str | None, prompt: list[int], required: str) -> tuple[bool, bool]:
        """Whether the cache's known greedy continuation of ``prompt``, and the tokens its last
        request at this prompt was answered with, are what healing ``required`` would choose now
        (``healing.chain_fits``, ``healing.asked_fits``)."""
        if not required or cache_key is None or self.prefix_cache is None:
            return True, False
        chain = self.prefix_cache.chain(cache_key)
        known = chain_fits(self.healing_index, chain, prompt, required)
        return known, known and asked_fits(chain, prompt, required)

    def _answer_now(self, run: Run, text: str) -> tuple[list[int], str] | None:
        """The whole lines decoded so far, once an answer is due before the next pass would end
        (``GenerationConfig.answer_due``): a pass started then would only make the answer late.
        The next pass is expected to take as long as this decode's passes did on average."""
        due = run.config.answer_due
        if due is None:
            return None
        steps = run.stats.step_passes
        next_pass_ms = run.stats.verify_ms / steps if steps > 0 else 0.0
        return whole_lines(self.decode, run.generated, text, functools.partial(due, next_pass_ms))

    def _cut(self, run: Run) -> Cut:
        """``stops.cut_at_stop`` for this run; a healing that found no way on ends it empty."""
        if run.healing is not None and run.healing.failed:
            return Cut([], "", "stop", len(run.generated))
        config = run.config
        return cut_at_stop(
            self.decode,
            run.generated,
            config.stops,
            run.eos,
            config.max_new_tokens,
            config.required_prefix,
            config.stop_when,
        )

    # -- the loop -----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None = None,
        drafter: Drafter | None = None,
        cancel: CancelCheck = None,
        cache_key: str | None = None,
    ) -> GenerationResult:
        """Decode after ``prompt_ids``; ``cache_key`` names whose KV cache to reuse and keep."""
        run = self._start(prompt_ids, config or GenerationConfig(), drafter, cancel)
        if run.config.max_new_tokens <= 0 or is_cancelled(cancel):
            reason = "max_tokens" if run.config.max_new_tokens <= 0 else "cancelled"
            return GenerationResult("", [], reason, run.stats)
        borrowed = self._first_tokens(run, cache_key)
        if borrowed is None:
            return GenerationResult("", [], "cancelled", run.stats)
        decode_started = time.perf_counter()
        kept, text, reason, consumed = self._cut(run)
        while reason is None:
            if is_cancelled(cancel):
                reason = "cancelled"
                break
            early = self._answer_now(run, text)
            if early is not None:
                (kept, text), reason, consumed = early, "partial", len(run.generated)
                break
            self._speculative_step(run)
            kept, text, reason, consumed = self._cut(run)
        run.stats.decode_ms = (time.perf_counter() - decode_started) * 1000
        self._keep(run, borrowed, cache_key)
        known = len(borrowed.known or ())
        run.stats.new_tokens = len(kept)
        run.stats.known_tokens = min(consumed, known)
        run.stats.produced_tokens = consumed - run.stats.known_tokens
        return GenerationResult(text=text, token_ids=kept, stop_reason=reason, stats=run.stats)

    def _start(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig,
        drafter: Drafter | None,
        cancel: CancelCheck,
    ) -> Run:
        stats = GenerationStats()
        prompt = self._fit_context([int(t) for t in prompt_ids], config, stats)
        stats.prompt_tokens = len(prompt)
        generator = None
        if not config.sampling.greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(config.seed if config.seed is not None else torch.seed())
        healing = None
        if config.required_prefix:
            constraint = PrefixConstraint(self.healing_index, config.required_prefix)
            healing = Healing(constraint, self._healing_masks)
        return Run(prompt, config, drafter, cancel, stats, generator, healing, self.target.end_token_ids)

    def _first_tokens(self, run: Run, cache_key: str | None) -> Borrowed | None:
        """The prefill (with reuse, and a draft riding on it) and the tokens it yields; None when
        cancelled during the prefill."""
        started = time.perf_counter()
        config = run.config
        continuation, asked = self._reuse_fits(cache_key, run.prompt, config.required_prefix)
        if run.drafter is not None:
            run.drafter.begin(run.prompt, run.sampling, run.generator, session=cache_key)
        # The prefill carries a draft (not a sampled one while healing owes text: ``Healing``).
        draft_for = None
        if run.drafter is not None and self._may_draft(run) and config.max_new_tokens > 1:
            draft_for = functools.partial(self._propose, run, run.prompt, config.max_new_tokens)
        borrowed, logits, draft = self._prefill(
            run.prompt, cache_key, config, run.cancel, run.stats, continuation, draft_for, asked, run.healing
        )
        run.cache = borrowed.cache
        run.stats.prefill_ms = (time.perf_counter() - started) * 1000
        if borrowed.known:  # the target's own greedy continuation of this very prompt
            run.generated = list(borrowed.known)
            if run.healing is not None:
                run.healing.advance(run.generated)
            return borrowed
        if logits is None:
            return None
        run.stats.target_passes = 1
        verdict = self._verify(run, draft, logits)
        if verdict.accepted < len(draft):
            run.cache.crop(verdict.accepted - len(draft))
        run.generated = list(verdict.tokens)
        run.stats.prefill_tokens = len(run.generated)
        return borrowed

    def _speculative_step(self, run: Run) -> None:
        """Draft -> one target pass over the newest token and the draft -> accept -> crop."""
        remaining = run.config.max_new_tokens - len(run.generated)
        draft = Draft()
        if run.drafter is not None and remaining > 1 and self._may_draft(run):
            draft = self._propose(run, run.prompt + run.generated, remaining, run.cache)
        pass_started = self.pace.clock()
        allowed = self._masks(run.healing, draft)
        logits = self._forward(
            [run.generated[-1]] + draft.tokens, run.cache, run.sampling.greedy, allowed=allowed
        )
        verdict = self._verify(run, draft, logits)
        pass_ms = (self.pace.clock() - pass_started) * 1000
        self.cost.record(len(draft) + 1, pass_ms)
        self.pace.record(len(draft) + 1, pass_ms)
        run.stats.verify_ms += pass_ms
        run.stats.target_passes += 1
        rejected = len(draft) - verdict.accepted
        if rejected:
            run.cache.crop(-rejected)
        run.generated.extend(verdict.tokens)

    @staticmethod
    def _may_draft(run: Run) -> bool:
        """Whether a draft may be verified now: not a sampled one while healing owes text."""
        return run.sampling.greedy or run.healing is None or not run.healing.active

    def _verify(self, run: Run, draft: Draft, logits: torch.Tensor) -> Acceptance:
        """Accept ``draft`` against ``logits`` (a row per draft token and one more), each row masked
        while healing owes text; records where the mask overrode the target's own choice."""
        healing = run.healing if run.healing is not None and run.healing.active else None
        if healing is None:
            return self._accept(run, draft, logits)
        masked, unmasked = healing.constrain(logits, healing.masks(draft.tokens, logits.device))
        verdict = self._accept(run, draft, masked)
        greedy = run.sampling.greedy
        for j, token in enumerate(verdict.tokens[: len(unmasked)]):
            healing.chose(len(run.generated) + j, token, unmasked[j] if greedy else None)
        healing.advance(verdict.tokens)
        return verdict

    def _propose(self, run: Run, tokens: list[int], remaining: int, cache: Any) -> Draft:
        """The drafter's proposal after ``tokens``, cut where healing would refuse it; a drafter
        that reads the target's state (a draft head) is shown the cache first, which holds every
        token but the newest."""
        assert run.drafter is not None
        started = time.perf_counter()
        run.drafter.attach(cache)
        healing = run.healing if run.healing is not None and run.healing.active else None
        run.drafter.steer(healing)
        ends = self._ending_tokens(run.config.stops if healing is None else (), run.eos)
        run.drafter.end_at(ends)
        draft = run.drafter.propose(tokens, min(remaining - 1, run.config.max_draft_tokens))
        if healing is not None:
            draft = healing.allowed_draft(draft)
        # A deterministic draft is cut by its tokens' values without bias; a sampled one may not be.
        kept = ends.length_before(draft.tokens) if draft.probs is None else len(draft)
        if kept < len(draft):
            draft = replace(draft, tokens=draft.tokens[:kept])
        run.stats.draft_ms += (time.perf_counter() - started) * 1000
        return draft

    def _ending_tokens(self, stops: tuple[str, ...], eos: frozenset[int]) -> EndingTokens:
        """The tokens that end a generation with ``stops`` (memoized: a few stop sets recur)."""
        ends = self._endings.get(stops)
        if ends is None or ends.eos != eos:
            if len(self._endings) >= 16:
                self._endings.clear()
            ends = self._endings[stops] = EndingTokens(self.decode, stops, eos)
        return ends

    def _choose(self, run: Run, logits: torch.Tensor) -> int:
        if run.sampling.greedy:
            return int(logits.argmax())
        return sample(sampling_probs(logits, run.sampling).cpu(), run.generator)

    def _accept(self, run: Run, draft: Draft, logits: torch.Tensor) -> Acceptance:
        """Greedy or speculative-sampling acceptance of ``draft``; feeds the drafter back."""
        if run.sampling.greedy:
            verdict = greedy_accept(draft.tokens, logits)
        else:
            target_probs = sampling_probs(logits, run.sampling).cpu()
            draft_probs = draft.probs.cpu() if draft.probs is not None else None
            verdict = speculative_accept(draft.tokens, draft_probs, target_probs, run.generator)
        if draft.tokens:
            assert run.drafter is not None
            per = run.stats.drafters.setdefault(draft.source or "draft", DrafterStats())
            per.drafts += 1
            per.proposed += len(draft)
            per.accepted += verdict.accepted
            run.drafter.observe(draft, verdict.accepted)
        return verdict

    def _keep(self, run: Run, borrowed: Borrowed, cache_key: str | None) -> None:
        """Give the cache back to the prefix store with the greedy chain it now holds."""
        if cache_key is None or self.prefix_cache is None:
            return
        # The loop's invariant: the cache holds every token but the newest. Greedy choices chain
        # on from where the borrowed chain began, or from this prompt's end, and never include a
        # token that healing chose over the unmasked argmax.
        chain = borrowed.greedy_from if borrowed.greedy_from is not None else len(run.prompt)
        if run.healing is not None and run.healing.deviated >= 0:
            chain = max(chain, len(run.prompt) + run.healing.deviated + 1)
        self.prefix_cache.put(
            cache_key,
            run.prompt + run.generated,
            run.cache,
            chain if run.sampling.greedy else None,
            ticket=borrowed.ticket,
            asked=borrowed.asked if run.config.ahead else Asked(len(run.prompt), run.config.required_prefix),
        )

    def generate_text(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: Drafter | None = None,
        cancel: CancelCheck = None,
        cache_key: str | None = None,
    ) -> GenerationResult:
        return self.generate(self.encode(prompt), config, drafter, cancel, cache_key)
