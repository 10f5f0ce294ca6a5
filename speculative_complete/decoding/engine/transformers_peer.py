"""transformers' own ``generate()`` as a decoding path, so benchmarks can compare it side by side.

Not the product's path: it prefills the whole prompt on every call (no KV reuse across requests)
and its speculation cannot be gated by expected gain. It is here so the replay benchmark can run
the same server with transformers' prompt lookup (``prompt_lookup_num_tokens``) or assisted
generation (``assistant_model``) in place of this project's engine, and measure the difference
rather than claim it. Stops, the cancel check and the result are the engine's, so both paths
answer the same way; target forward passes are counted with a forward hook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from speculative_complete.decoding.engine.loop import (
    CancelCheck,
    GenerationConfig,
    GenerationResult,
    GenerationStats,
    SpeculativeEngine,
    is_cancelled,
)
from speculative_complete.decoding.engine.stops import cut_at_stop
from speculative_complete.decoding.models.loading import LoadedModel

PROMPT_LOOKUP_TOKENS = 10  # transformers' documented example value, used by decode_bench too


class _StopWhen(StoppingCriteria):
    """Ends generate() at a cancel, or once the new tokens' text holds a stop string or EOS."""

    def __init__(
        self, engine: SpeculativeEngine, prompt_len: int, config: GenerationConfig, cancel: CancelCheck
    ) -> None:
        self.engine, self.prompt_len, self.config, self.cancel = engine, prompt_len, config, cancel
        self.cancelled = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        if is_cancelled(self.cancel):
            self.cancelled = True
            return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        new = input_ids[0, self.prompt_len :].tolist()
        _, _, reason, _ = cut_at_stop(
            self.engine.decode,
            new,
            self.config.stops,
            self.engine.target.end_token_ids,
            self.config.max_new_tokens,
            "",
            self.config.stop_when,
        )
        done = reason is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class TransformersDecoder:
    """``model.generate()`` greedy, with prompt lookup (``ngram``/``auto``) or an assistant (``model``)."""

    def __init__(self, engine: SpeculativeEngine, draft: LoadedModel | None = None) -> None:
        if engine.target.model is None or (draft is not None and draft.model is None):
            raise ValueError(
                "the transformers decoder needs models loaded into transformers (set quantization to none)"
            )
        self.engine, self.draft = engine, draft
        self._passes = 0
        engine.target.model.register_forward_hook(self._count_pass)
        eos = sorted(engine.target.end_token_ids)
        pad = getattr(engine.target.tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (eos[0] if eos else 0)

    def _count_pass(self, module: torch.nn.Module, args: object, output: object) -> None:
        self._passes += 1

    def _method_kwargs(self, drafter_name: str) -> tuple[str, dict]:
        if drafter_name in ("ngram", "auto"):
            return "hf_prompt_lookup", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
        if drafter_name == "model" and self.draft is not None:
            return "hf_assisted", {"assistant_model": self.draft.model}
        return "hf_greedy", {}

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig,
        drafter_name: str,
        cancel: CancelCheck = None,
    ) -> GenerationResult:
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        if config.max_new_tokens <= 0 or not prompt_ids or is_cancelled(cancel):
            return GenerationResult("", [], "cancelled" if prompt_ids else "max_tokens", stats)
        _, kwargs = self._method_kwargs(drafter_name)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.engine.target.device)
        stop = _StopWhen(self.engine, len(prompt_ids), config, cancel)
        self._passes = 0
        started = time.perf_counter()
        out = self.engine.target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=config.max_new_tokens,
            do_sample=False,
            pad_token_id=self.pad_token_id,
            stopping_criteria=StoppingCriteriaList([stop]),
            **kwargs,
        )
        stats.decode_ms = (time.perf_counter() - started) * 1000
        stats.target_passes = self._passes
        stats.prefill_tokens = min(1, self._passes)  # generate()'s prefill carries no draft
        new = out[0, len(prompt_ids) :].tolist()
        kept, text, reason, consumed = cut_at_stop(
            self.engine.decode,
            new,
            config.stops,
            self.engine.target.end_token_ids,
            config.max_new_tokens,
            "",
            config.stop_when,
        )
        if stop.cancelled:
            reason = "cancelled"
        # generate() reports no per-draft acceptance; tokens per target pass is what it tells.
        stats.new_tokens, stats.produced_tokens = len(kept), consumed
        return GenerationResult(text=text, token_ids=kept, stop_reason=reason or "max_tokens", stats=stats)
