"""Drafts from a draft head (``draft_head/network.py``) reading the target's own hidden states.

The head's entries mirror the target's cache: entry j reads the target's hidden state f_j and
token j+1, so once the target has fed position j the entry can be computed for good. Between
proposals the drafter keeps those "true" entries (a few KB per token) and compares token lists to
find which still hold, as the draft model does; each proposal computes the missing true entries
in one pass, then chains speculative ones (its own estimate standing in for f) over any tokens
the target has not fed yet and over the tokens it drafts, and crops them off again.

The head attends over at most ``2 * WINDOW`` entries (it was trained on ``WINDOW``). Where it
is behind by more than ``RESTART`` tokens (a new prompt, an edit far back) it restarts from the
last ``RESTART`` positions instead of catching up: on held-out code its agreement hardly depends
on how many entries it sees past the first 8, and a pass over 32 entries costs a fraction of one
over 256 (figures: ``benchmarks/README.md``, "Measurements behind design choices").

How far to draft: the head's probability for its own token, under the temperature fitted for it
on held-out code (``HeadConfig.confidence_temperature``), tracks how often its greedy token
agrees with the target's (``benchmarks/head_tree.py``), so the product of those
probabilities is the chance that a whole chain is kept. Where ``auto`` drafts from the head it
goes on while that chance beats what one more token costs (its share of a wider verify pass and
a head step, ``_worth``), as EAGLE-2 sizes its drafts by confidence, and stops (possibly before
the first token) where it does not.
That is decided before each token is drawn, from what the draw does not change: a sampled
token dropped for its own low probability would come from q restricted to the likely tokens
while the engine's acceptance rule is told q, a biased output. A greedy draft is weighed by the
head's confidence in its best token, a sampled one by the chance that two draws from q agree.

What a proposal costs on the CPU is reading the head's weights and its tokens' output rows:
after a target pass has streamed ~100 MB through the caches they come from memory again. So the
head's layers and rows run on the 4-bit kernel (``HEAD_BITS``; Q4_1 blocks of its bf16 weights,
a quarter of bf16's bytes), which costs less than half bf16's time for a small loss of held-out
agreement. And its q/k/v and gate/up run as one product each (``DraftHead.fuse``): six kernel
calls a chained step (fc, qkv, o, gate-up, down, scores) instead of nine, which bought little,
the kernel's own time being most of a step (figures: ``benchmarks/README.md``). The target
verifies every draft and a sampled draft's q is the distribution its token was drawn from, so
exactness does not depend on any of this.

On a GPU (the graphed forward, ``speculative_complete/decoding/forward/graphed.py``) the head runs
dense in bf16 on the target's device, reading the graphed cache's hidden states where they are; only
a sampled draft's distribution goes to the CPU, where the engine's generator draws from it. There
its steps run eagerly and cost more than a graphed target step (measured on an H200: the README's
"On a GPU"), so ``auto`` leaves it alone; graphing the head's step is what would change that.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from speculative_complete.decoding.cost_model import CostModel, ema, timed_ema
from speculative_complete.decoding.draft_head.network import DraftHead, HeadCache, load_head, shipped_head
from speculative_complete.decoding.draft_head.precision import head_dtype
from speculative_complete.decoding.drafter_interface import Draft, Drafter, OwedText
from speculative_complete.decoding.drafters.length import AcceptanceStats
from speculative_complete.decoding.forward.model_pass import HiddenStates
from speculative_complete.decoding.forward.quant.layers import SmallLinear, quantize_linears
from speculative_complete.decoding.kv_cache import common_prefix_length
from speculative_complete.decoding.models.loading import LoadedModel, ModelLoadError, hub_cache_folder
from speculative_complete.decoding.verify import SamplingParams, sample, sampling_probs

log = logging.getLogger(__name__)

Embed = Callable[[torch.Tensor], torch.Tensor]  # token ids -> (rows, dim) fp32

HEAD_BITS = 4


class HeadDrafter(Drafter):
    name = "head"
    WINDOW = 256
    RESTART = 32
    # Tokens the target has not fed yet that the head may chain over before drafting (a draft
    # riding on a short prefill); past this it waits for the target's own hidden states.
    MAX_UNFED = 4

    def __init__(
        self,
        head: DraftHead,
        embed: Embed,
        output_rows: torch.Tensor,
        vocab_size: int,
        eos: frozenset[int],
        max_draft: int = 8,
        cost: CostModel | None = None,
        bits: int | None = None,
    ) -> None:
        """``output_rows``: the target's output layer's rows for ``head.vocab`` (all rows when the
        head scores the whole vocabulary), (len(vocab) or vocab_size, dim), fp32, on the device
        the target's hidden states are (and the head will be). ``bits`` 4 or 8 puts the head's
        layers and those rows on the CPU's 4-bit kernel (``quant.layers.SmallLinear``, see
        ``HEAD_BITS``); None keeps them dense, in bf16 on an accelerator or where bf16 is faster
        on this CPU (``head_dtype``), else fp32. ``head`` is converted in place."""
        self.device = output_rows.device
        if bits and self.device.type != "cpu":
            raise ValueError("a quantized draft head runs on the CPU only")
        self.dtype = torch.bfloat16 if bits else head_dtype(output_rows.shape[1], self.device)
        self.head, self.embed = head.fuse().to(self.device, self.dtype), embed
        self.bits = bits
        if bits:
            quantize_linears(self.head, bits)
        self._score = self._scorer(output_rows)
        self._vocab_on_cpu = self.head.vocab.cpu()  # where a sampled draft's q is made
        self._steer: OwedText | None = None
        self._ends: Callable[[int], bool] = lambda token: False  # tokens that end the generation
        self._allowed_rows: dict[bytes, torch.Tensor] = {}  # by the text healing still owes
        self._vocab_sorted = self._vocab_on_cpu.sort()  # to find allowed ids among the scored
        self.folder = ""  # where the head was loaded from, for logs and stats
        self.vocab_size, self.eos = vocab_size, eos
        self.max_draft = max_draft
        self.cost = cost or CostModel.for_device("cpu")
        # Draft only as far as the head's confidence pays (``propose`` and ``auto``); off, every
        # proposal drafts its full length (tests see drafts rejected at every position).
        self.confident = True
        self.stats = AcceptanceStats(priors={0: 0.5})
        # EMAs of a proposal's time and of the tokens it drafted: their ratio prices a drafted
        # token, proposals that drafted nothing included.
        self._proposal_ms: float | None = None
        self._proposal_tokens: float | None = None
        self._chain_ms: float | None = None  # EMA of one chained step: what one more token costs
        self._sampling = SamplingParams()
        self._generator: torch.Generator | None = None
        # The target's cache (``hidden`` and ``length``), weakly: a cache the prefix store evicts
        # must not live on here.
        self._target: weakref.ref | None = None
        self._cache = HeadCache()
        self._tokens: list[int] = []  # the tokens the true entries were computed from
        self._base = 0  # the position of the head cache's first entry
        self._warm_up()

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """A step over two entries, one over one and a scoring, on dummy inputs. A device loads
        its kernels on first use (CUDA: cuBLAS, attention), and a first chained step timed while
        it did so priced every later draft out: on an H200 the head drafted nothing before this,
        and drafting nothing it never timed a step again (``_step`` times catch-ups now too)."""
        features = torch.zeros(2, self.head.config.dim, device=self.device)
        g = self._step(features, [0, 0], 0)
        self._score(self._step(g[-1:], [0], 2)[-1])
        self._cache, self._chain_ms = HeadCache(), None  # the cold step's time prices nothing

    def begin(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        generator: torch.Generator | None,
        session: str | None = None,
    ) -> None:
        self._sampling, self._generator = sampling, generator

    def attach(self, target_cache: Any) -> None:
        """The target's cache this generation feeds: its ``hidden`` rows are the head's input."""
        self._target = weakref.ref(target_cache) if target_cache is not None else None

    @property
    def _cache_of_target(self) -> Any:
        return self._target() if self._target is not None else None

    def forget(self, session: str) -> None:
        """Nothing per session: entries are recomputed from the target's cache when tokens differ."""

    def end_at(self, ends: Callable[[int], bool]) -> None:
        self._ends = ends

    def steer(self, owed: OwedText | None) -> None:
        """While token healing owes text (a cursor mid-word), greedy drafts choose among what it
        allows, as the target's masked pass will: the head's best guess at which word the typed
        letters begin, where its unconstrained guess (often another word) would be refused at
        once. None: unconstrained."""
        self._steer = owed

    def _rows_allowed(self, drafted: Sequence[int]) -> torch.Tensor | None:
        """Indices into the head's scores of the tokens healing allows after ``drafted``; None
        when nothing is owed (every token may be drafted)."""
        owed = self._steer.allowed_after(drafted) if self._steer is not None else None
        if owed is None:
            return None
        key, allowed = owed
        rows = self._allowed_rows.get(key)
        if rows is None:
            ids = torch.tensor(allowed, dtype=torch.long)
            ordered, order = self._vocab_sorted
            if len(ordered):  # the head scores only these: where each allowed id sits among them
                at = torch.searchsorted(ordered, ids).clamp(max=len(ordered) - 1)
                ids = order[at[ordered[at] == ids]]
            rows = ids.to(self.device)
            if len(self._allowed_rows) > 64:
                self._allowed_rows.clear()
            self._allowed_rows[key] = rows
        return rows

    @property
    def step_ms(self) -> float | None:
        """A proposal's time per drafted token."""
        if self._proposal_ms is None or self._proposal_tokens is None:
            return None
        return self._proposal_ms / max(self._proposal_tokens, 0.25)

    def _in_steps(self, ms: float | None) -> float:
        """``ms`` in target steps (0.05 until both are measured)."""
        target = self.cost.step_ms
        return ms / target if (ms is not None and target) else 0.05

    @property
    def relative_cost(self) -> float:
        return self._in_steps(self.step_ms)

    def _worth(self, drafted: int, chance: float) -> bool:
        """Whether a token drafted after ``drafted`` others, kept with probability ``chance``
        (all before it kept too), is expected to save more than it costs, in target steps: a
        wider verify pass, and the head step that drafts the token after it."""
        return chance > self.cost.added_row(drafted) + self._in_steps(self._chain_ms)

    def usable(self, tokens: Sequence[int]) -> bool:
        """Whether the target's cache holds enough of ``tokens`` to draft after them."""
        fed = self._fed(tokens)
        return fed > 0 and len(tokens) - 1 - fed <= self.MAX_UNFED

    def _fed(self, tokens: Sequence[int]) -> int:
        target = self._cache_of_target
        if not isinstance(target, HiddenStates):  # none yet, or a cache that keeps none
            return 0
        return min(int(target.length), len(tokens) - 1)

    # -- the head's entries -------------------------------------------------------------------------
    def _step(self, features: torch.Tensor, tokens: Sequence[int], first: int) -> torch.Tensor:
        """Entries ``first`` .. for ``features`` (rows, dim) and their next ``tokens``; their g.
        A one-row step is what one more drafted token costs, whether it chains a draft or catches
        up with a token the target accepted: each one is timed, so that price stays current even
        while the head drafts nothing."""
        started = time.perf_counter()
        ids = torch.tensor(list(tokens), dtype=torch.long)
        rows = len(ids)
        positions = torch.arange(first - self._base, first - self._base + rows, device=self.device)
        mask = None  # one row sees every entry: no mask
        if rows > 1:
            past = self._cache.length
            mask = torch.ones(rows, past + rows, dtype=torch.bool, device=self.device).tril_(past)
        embeds = self.embed(ids)[None].to(self.dtype)
        g = self.head(features[None].to(self.dtype), embeds, positions, mask, self._cache)
        if rows == 1:
            self._chain_ms = timed_ema(self._chain_ms, (time.perf_counter() - started) * 1000)
        return g[0]

    def _sync(self, tokens: Sequence[int], fed: int) -> torch.Tensor:
        """True entries up to ``fed - 1`` (entry j reads f_j and token j+1); the last one's g."""
        valid = min(common_prefix_length(self._tokens, tokens) - 1, fed) - self._base
        valid = min(valid, self._cache.length)
        if valid <= 0 or fed - (self._base + valid) > self.RESTART or self._cache.length > 2 * self.WINDOW:
            self._cache, self._base, valid = HeadCache(), max(0, fed - self.RESTART), 0
        start = self._base + valid
        if start == fed:  # every entry still holds: recompute the last one for its g
            start, valid = fed - 1, valid - 1
        self._cache.crop(valid)
        features = self._cache_of_target.hidden[start:fed]
        g = self._step(features, tokens[start + 1 : fed + 1], start)
        self._tokens = list(tokens[: fed + 1])
        return g[-1]

    def _scorer(self, output_rows: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """g (dim,) -> fp32 scores of the head's tokens, from rows on the 4-bit kernel or dense."""
        if self.bits and SmallLinear.fits(output_rows):
            layer = SmallLinear(output_rows, None, self.bits)
            return lambda g: layer(g[None])[0].float()
        rows = output_rows.to(self.dtype)
        return lambda g: (rows @ g.to(rows.dtype)).float()

    def _scores(self, g: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 scores of the head's tokens after g; those healing does not allow (``allowed``,
        greedy only) -inf."""
        scores = self._score(g)
        if allowed is not None:
            scores = torch.full_like(scores, float("-inf")).index_copy_(0, allowed, scores[allowed])
        return scores

    def _confidence(self, scores: torch.Tensor) -> float:
        """The head's probability for its best token, under its fitted temperature: how often
        such a token is kept (the module's docstring)."""
        tempered = (scores - scores.max()) / self.head.config.confidence_temperature
        return float(1.0 / torch.exp(tempered).sum())

    def _distribution(self, scores: torch.Tensor) -> torch.Tensor:
        """The full-vocabulary distribution a sampled draft token is drawn from: the head's
        tokens' scores shaped as the generation samples (every other token -inf), on the CPU
        where the engine's generator draws."""
        logits = scores = scores.cpu()
        if len(self.head.vocab):
            logits = torch.full((self.vocab_size,), float("-inf"))
            logits[self._vocab_on_cpu] = scores
        return sampling_probs(logits, self._sampling)

    def _best(self, scores: torch.Tensor) -> int:
        best = int(scores.argmax())
        return int(self.head.vocab[best]) if len(self.head.vocab) else best

    # -- proposing ------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose_exactly(self, tokens: Sequence[int], k: int, confident: bool = False) -> Draft:
        """Draft ``k`` tokens (fewer at an end-of-text token; with ``confident``, only as many as
        are worth verifying, see the module's docstring); empty when the target's cache does not
        hold enough of ``tokens`` (``usable``)."""
        if k <= 0 or not self.usable(tokens):
            return Draft(source=self.name)
        started = time.perf_counter()
        fed = self._fed(tokens)
        g = self._sync(tokens, fed)
        true_entries = self._cache.length
        for j in range(fed, len(tokens) - 1):  # tokens the target has not fed: chain over them
            g = self._step(g[None], [tokens[j + 1]], j)[-1]
        drafted: list[int] = []
        rows: list[torch.Tensor] = []
        chance = 1.0  # that every token drafted so far is kept
        steered = self._steer is not None and self._sampling.greedy
        for i in range(k):
            allowed = self._rows_allowed(drafted) if steered else None
            if allowed is not None and not len(allowed):
                break  # healing allows none of the head's tokens
            scores = self._scores(g, allowed)
            # How far to draft is decided before drawing: a sampled token kept or dropped by
            # its own probability would come from q restricted to the likely tokens, not from
            # the q the engine's acceptance rule is given (a biased output). A sampled draft is
            # weighed by the chance that two draws from q agree, a greedy one by its confidence.
            q = None if self._sampling.greedy else self._distribution(scores)
            chance *= self._confidence(scores) if q is None else float(q.square().sum())
            if confident and not self._worth(i, chance):
                break
            token = self._best(scores) if q is None else sample(q, self._generator)
            if q is None and self._ends(token):
                break  # the target's row there gives its own token: verifying this one buys nothing
            drafted.append(token)
            if q is not None:
                rows.append(q)
            if i == k - 1 or token in self.eos:
                break
            g = self._step(g[None], [token], len(tokens) - 1 + i)[-1]
        self._cache.crop(true_entries)
        # The whole proposal: catching up with the target's new states (a pass over the tokens
        # it accepted) is part of what a draft costs.
        self._proposal_ms = ema(self._proposal_ms, (time.perf_counter() - started) * 1000)
        self._proposal_tokens = ema(self._proposal_tokens, len(drafted))
        probs = torch.stack(rows) if rows else None
        return Draft(tokens=drafted, probs=probs, source=self.name)

    def propose(self, tokens: Sequence[int], max_len: int) -> Draft:
        return self.propose_exactly(tokens, min(max_len, self.max_draft), confident=self.confident)

    def observe(self, draft: Draft, accepted: int) -> None:
        self.stats.update(0, accepted, len(draft))


def load_head_drafter(
    target: LoadedModel,
    spec: str = "auto",
    max_draft: int = 8,
    cost: CostModel | None = None,
    bits: int | None = HEAD_BITS,
) -> HeadDrafter | None:
    """The head named by ``spec`` for ``target``: ``auto`` is the shipped head trained for this
    very target if there is one, ``none`` no head, anything else a folder (or its weights file) or
    a hub id in the local Hugging Face cache. A head that does not fit the target is refused with
    a ValueError meant for the user. Off the CPU (a graphed target) the head runs dense in bf16
    beside the target, whatever ``bits`` says."""
    if spec == "none":
        return None
    mark = target.forward.fingerprint
    if mark is None:
        if spec == "auto":
            return None
        raise ValueError("a draft head needs the quantized lean forward (a Llama-family GGUF, or int4/int8)")
    folder = shipped_head(mark) if spec == "auto" else _head_folder(spec)
    if folder is None:
        return None
    device = torch.device(target.device)
    if device.type != "cpu":
        bits = None
    try:
        head = load_head(folder, head_dtype(target.forward.shape.dim, device))
    except (OSError, KeyError, TypeError, ValueError, SafetensorError) as exc:
        raise ValueError(f"draft head {spec}: cannot be read ({exc})") from exc
    if head.config.target and head.config.target != mark:
        raise ValueError(f"draft head {folder} was trained for another model ({head.config.target})")
    if head.config.dim != target.forward.shape.dim:
        raise ValueError(
            f"draft head {folder} has width {head.config.dim}, the model {target.forward.shape.dim}"
        )
    ids = head.vocab if len(head.vocab) else torch.arange(target.vocab_size)
    # in slices: the fp32 rows of a large vocabulary would be a transient the heap keeps
    dtype = torch.float32 if bits else head.fc.weight.dtype  # fp32 rows are quantized once
    rows = torch.cat([target.forward.output_rows(part).to(dtype) for part in ids.split(2048)])
    log.info("draft head %s (%d tokens scored, %s)", folder, len(ids), f"{bits}-bit" if bits else dtype)
    drafter = HeadDrafter(
        head, target.forward.embed, rows, target.vocab_size, target.end_token_ids, max_draft, cost, bits
    )
    drafter.folder = str(folder)
    return drafter


def _head_folder(spec: str) -> Path:
    path = Path(spec).expanduser()
    if path.is_file():
        return path.parent
    if path.is_dir():
        return path
    try:
        return hub_cache_folder(spec)
    except ModelLoadError as exc:
        raise ValueError(f"draft head not found: {spec}") from exc
