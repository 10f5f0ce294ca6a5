"""The speculative decoding loop: prefill, draft, verify in one target pass, accept, roll back.

One clear loop in the style of gpt-fast's ``generate.py``. The target's KV cache always holds
every token except the newest, which is fed together with the next draft; after acceptance the
cache is cropped to drop the rejected draft tokens. Between any two target passes the loop
polls a cancel check, so a cancel (a new keystroke, a time budget) takes effect within one step
and returns what was decoded so far.

With a ``PrefixCache`` and a ``cache_key`` (the server passes the document), the cache a
generation leaves behind serves the next one on that key: only the prompt tokens after the
longest common prefix are prefilled. The prefill runs in chunks with the cancel check between
them, each sized by measured time to take about as long wherever it runs (``decoding.pacing``),
so a superseded request stops within one short chunk and what it did prefill still warms the
cache for the next keystroke. A caller that must answer early (``GenerationConfig.answer_due``)
gets the whole lines decoded so far, and the cache keeps the rest of what was decoded.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from decoding.drafters.base import Draft, Drafter
from decoding.drafters.length import CostModel
from decoding.healing import HealingIndex, PrefixConstraint
from decoding.kv_cache import Asked, Borrowed, PrefixCache
from decoding.models import LoadedModel
from decoding.pacing import PREFILL_PASS_MS, PrefillPace
from decoding.results import DrafterStats, GenerationResult, GenerationStats
from decoding.verify import (
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
    # How long a prefill pass should take (``decoding.pacing``): passes are sized from the measured
    # time per token. None: every pass is ``prefill_chunk`` tokens (a benchmark's one-pass prefill).
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
    # Polled between passes like the cancel check: once it says an answer is due (a first-answer
    # budget ran out), a text that holds a whole line ends after its last whole line, with the
    # stop reason "partial". Every token decoded stays on the cache's greedy chain, so the rest
    # can be decoded ahead and the next request answered from it. For multi-line suggestions: a
    # single line has no whole line before its end.
    answer_due: Callable[[], bool] | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def stops(self) -> tuple[str, ...]:
        return tuple(s for s in self.stop_strings if s) + (("\n",) if self.stop_at_newline else ())


def _covered(text: str, prefix: str) -> int:
    """How many leading characters of ``text`` belong to the required prefix: all of it once
    generated, else the part generated so far (the text is still inside the prefix)."""
    if not prefix:
        return 0
    if text.startswith(prefix):
        return len(prefix)
    return min(len(prefix), len(text))  # still inside it (or a tokenizer that normalizes text)


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
    eos: set[int]  # the target's end-of-text tokens, looked up once per generation
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
                bos = next(iter(sorted(self.target.eos_token_ids)), 0)
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
        if total - end < self.pace.min_tokens and total - done <= most:
            end = total
        return end

    def _known_fits(self, cache_key: str | None, prompt: list[int], required: str) -> bool:
        """Whether a known greedy continuation of ``prompt`` (if the cache has one) is also what
        healed decoding would choose: it is, exactly when each of its tokens spent while the
        required text is owed is an allowed one (the masked argmax of a set that holds the
        unmasked argmax is that argmax)."""
        if not required or cache_key is None or self.prefix_cache is None:
            return True
        peek = self.prefix_cache.chain(cache_key)
        if (
            peek is None
            or peek.greedy_from is None
            or len(peek.tokens) <= len(prompt)
            or peek.tokens[: len(prompt)] != prompt
        ):
            return True  # no known continuation will be offered
        return self._allowed_while_owed(peek.tokens[len(prompt) :], required)

    def _asked_fits(self, cache_key: str | None, prompt: list[int], required: str) -> bool:
        """Whether the tokens the last request at this very prompt was answered with (healed,
        so not on the greedy chain) are what healing ``required`` would choose now. That is the
        user typing on inside the healed word (at ``self.le`` the prompt ends at ``self`` and owes
        ``.le``; at ``self.lev`` it is the same prompt owing ``.lev``): where ``required`` extends
        the text that request owed, each set of tokens it allows is within the set that request's
        choice was the best of, so where that choice is allowed it is the best of this set too.
        In the keystroke replay a third of all target passes went to decoding such prompts again.
        Asked only where ``_known_fits`` held: it has checked these very tokens against
        ``required`` (the same peek, past the same prompt)."""
        if not required or cache_key is None or self.prefix_cache is None:
            return False
        peek = self.prefix_cache.chain(cache_key)
        if peek is None or peek.asked is None or peek.greedy_from is None:
            return False
        asked = peek.asked
        return (
            asked.prompt_tokens == len(prompt) < len(peek.tokens)
            and required.startswith(asked.owed)
            and peek.tokens[: len(prompt)] == prompt
        )

    def _allowed_while_owed(self, tokens: Sequence[int], required: str) -> bool:
        """Whether each of ``tokens`` spent while ``required`` is owed is an allowed one."""
        return PrefixConstraint(self.healing_index, required).allowed_length(tokens) == len(tokens)

    def cut_at_stop(
        self,
        generated: list[int],
        stops: tuple[str, ...],
        eos: set[int],
        max_new: int,
        prefix: str = "",
        stop_when: Callable[[str], int | None] | None = None,
    ) -> tuple[list[int], str, str | None, int]:
        """Apply EOS, the token limit and stop strings to the tokens generated so far.

        Returns the tokens to keep, their text (after ``prefix``, the required text of a healed
        prompt: stops are looked for only after it), why generation stopped (None: go on) and how
        many generated tokens that decision consumed (the kept ones plus the stopping token).
        """
        reason = None
        for i, token in enumerate(generated):
            if token in eos:
                generated, reason = generated[:i], "eos"
                break
        consumed = len(generated) + (reason == "eos")
        if len(generated) >= max_new:
            generated, reason, consumed = generated[:max_new], reason or "max_tokens", min(consumed, max_new)
        full = self.decode(generated)
        skip = _covered(full, prefix)
        text = full[skip:]

        def cut_of(body: str) -> int:
            found = [pos for pos in (body.find(s) for s in stops) if pos >= 0]
            custom = stop_when(body) if stop_when is not None and body else None
            if custom is not None:
                found.append(max(0, min(custom, len(body))))
            return min(found, default=-1)

        cut = cut_of(text)
        if cut < 0:
            return generated, text, reason, consumed
        keep = self._tokens_before(generated, skip + cut)
        seen = keep + 1  # the first prefix whose text already contains a stop
        while seen < len(generated) and cut_of(self.decode(generated[:seen])[skip:]) < 0:
            seen += 1
        return generated[:keep], text[:cut], "stop", seen

    def _tokens_before(self, generated: list[int], chars: int) -> int:
        """How many leading ``generated`` tokens have their text within its first ``chars``."""
        keep = 0
        while keep < len(generated) and len(self.decode(generated[: keep + 1])) <= chars:
            keep += 1
        return keep

    def _whole_lines(self, run: Run, text: str) -> tuple[list[int], str] | None:
        """The answer of a generation whose answer is due (``GenerationConfig.answer_due``): its
        text up to the last line end and the tokens within it. None while it is not due, or while
        no whole line with something on it is ready (then decoding goes on until one is).

        Only called while no stop has cut ``text``: it is all the generated text after the
        required prefix, so the prefix's length is what the full text has more."""
        due = run.config.answer_due
        end = text.rfind("\n")
        if due is None or end < 0 or not text[:end].strip() or not due():
            return None
        skip = len(self.decode(run.generated)) - len(text)
        return run.generated[: self._tokens_before(run.generated, skip + end)], text[:end]

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
            early = self._whole_lines(run, text)
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
        return Run(prompt, config, drafter, cancel, stats, generator, healing, self.target.eos_token_ids)

    def _first_tokens(self, run: Run, cache_key: str | None) -> Borrowed | None:
        """The prefill (with reuse, and a draft riding on it) and the tokens it yields; None when
        cancelled during the prefill."""
        started = time.perf_counter()
        config = run.config
        continuation = self._known_fits(cache_key, run.prompt, config.required_prefix)
        asked = continuation and self._asked_fits(cache_key, run.prompt, config.required_prefix)
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
        pass_started = time.perf_counter()
        allowed = self._masks(run.healing, draft)
        logits = self._forward(
            [run.generated[-1]] + draft.tokens, run.cache, run.sampling.greedy, allowed=allowed
        )
        verdict = self._verify(run, draft, logits)
        pass_ms = (time.perf_counter() - pass_started) * 1000
        self.cost.record(len(draft) + 1, pass_ms)
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
        run.drafter.steer(healing.allowed_after if healing is not None else None)
        draft = run.drafter.propose(tokens, min(remaining - 1, run.config.max_draft_tokens))
        if healing is not None:
            draft = healing.allowed_draft(draft)
        run.stats.draft_ms += (time.perf_counter() - started) * 1000
        return draft

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

    def _cut(self, run: Run) -> tuple[list[int], str, str | None, int]:
        """``cut_at_stop`` for this run; a healing that found no way on ends it empty."""
        config = run.config
        kept, text, reason, consumed = self.cut_at_stop(
            run.generated,
            config.stops,
            run.eos,
            config.max_new_tokens,
            config.required_prefix,
            config.stop_when,
        )
        if run.healing is not None and run.healing.failed:
            return [], "", "stop", len(run.generated)
        return kept, text, reason, consumed

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
