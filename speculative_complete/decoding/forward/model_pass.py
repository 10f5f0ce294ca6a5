"""The target's forward pass behind one small interface, so the engine never calls a model directly.

The engine needs three things of a model: an empty cache, a pass that feeds tokens after what
the cache holds and returns their next-token logits, and a cache it can crop (``crop(-n)``
drops the last n tokens, as transformers' ``DynamicCache`` does) and measure
(``get_seq_length()``). ``TransformersPass`` gives that for any causal LM transformers loads;
``speculative_complete.decoding.forward.llama.LlamaForward`` is the lean CPU forward on quantized
weights, and ``speculative_complete.decoding.forward.graphed.GraphedForward`` its fixed-width
CUDA-graph variant. A remote engine or another backend is one more implementation of ``ModelPass``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class HiddenStates(Protocol):
    """A cache that keeps each fed position's final hidden state (the lean forwards' caches), which
    a draft head reads; transformers' caches keep none."""

    hidden: torch.Tensor  # (capacity, dim): rows up to ``length`` are the fed positions'
    length: int


class ModelPass(Protocol):
    vocab_size: int
    # Relative cost of a pass over n tokens, where the pass knows it (None: the device's default).
    cost_prior: dict[int, float] | None
    # Which draft head fits this forward
    # (``speculative_complete.decoding.forward.llama.LlamaForward.fingerprint``); None where its
    # cache keeps no hidden states for a head to read.
    fingerprint: str | None
    # The most positions one cache holds, where the forward sets a limit of its own (a graphed
    # cache's fixed size); None: the model's context.
    max_context: int | None

    def new_cache(self) -> Any:
        """An empty cache for this model (``crop`` and ``get_seq_length`` as above)."""

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the output layer, fp32 on the forward's device (what a draft head
        scores its features against)."""

    def __call__(
        self,
        tokens: Sequence[int],
        cache: Any,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
        greedy_only: bool = False,
    ) -> torch.Tensor:
        """Feed ``tokens`` after ``cache`` (which then holds them too); the logits of the last
        ``keep`` positions (0: all), as a (rows, vocab) tensor. ``allowed``: for each returned
        row (None, or a row's None: every token), the token ids its greedy choice is made among
        (token healing's constraint); the argmax over them must be the exact model's.
        ``greedy_only``: the caller reads only each row's greedy choices (over all tokens and over
        ``allowed``), so a pass may leave logits that cannot be one approximate and spend its
        time certifying the choices instead
        (``speculative_complete.decoding.forward.quant.layers.CertifiedOutputLayer``); sampling
        reads every logit and passes False. Given with each pass, never kept as state, so two
        generations sharing a forward cannot change what the other's pass computes."""


class TransformersPass:
    """``ModelPass`` over a transformers causal LM and a ``GrowingLayer`` cache."""

    cost_prior = (
        None  # fp32 CPU and accelerators: the device defaults in speculative_complete/decoding/cost_model.py
    )
    fingerprint = None  # transformers' caches keep no hidden states for a draft head
    max_context = None

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings().weight[ids.to(self.device)].float()

    def new_cache(self) -> Any:
        from speculative_complete.decoding.forward.growing_cache import new_cache

        return new_cache(self.model.config)

    def __call__(
        self,
        tokens: Sequence[int],
        cache: Any,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
        greedy_only: bool = False,
    ) -> torch.Tensor:
        """Every logit as the model computes it (``allowed`` and ``greedy_only`` change nothing)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0]
