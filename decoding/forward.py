"""The target's forward pass behind one small interface, so the engine never calls a model directly.

The engine needs three things of a model: an empty cache, a pass that feeds tokens after what
the cache holds and returns their next-token logits, and a cache it can crop (``crop(-n)``
drops the last n tokens, as transformers' ``DynamicCache`` does) and measure
(``get_seq_length()``). ``TransformersPass`` gives that for any causal LM transformers loads;
``decoding.llama.LlamaForward`` is the lean CPU forward on quantized weights, and
``decoding.graphed.GraphedForward`` its fixed-width CUDA-graph variant. A remote engine or another
backend is one more implementation of ``ModelPass``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch


class ModelPass(Protocol):
    vocab_size: int
    # Relative cost of a pass over n tokens, where the pass knows it (None: the device's default).
    cost_prior: dict[int, float] | None
    # A pass may also have ``greedy_only`` (bool, False by default): the engine sets it for each
    # generation, True when only each row's greedy token will be read, so the pass may give
    # logits that cannot be any row's greedy choice approximately (``decoding.llama.LlamaForward``).
    # Sampling sets it False.

    def new_cache(self) -> Any:
        """An empty cache for this model (``crop`` and ``get_seq_length`` as above)."""

    def __call__(
        self,
        tokens: Sequence[int],
        cache: Any,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens`` after ``cache`` (which then holds them too); the logits of the last
        ``keep`` positions (0: all), as a (rows, vocab) tensor. ``allowed``: for each returned
        row (None, or a row's None: every token), the token ids its greedy choice is made among
        (token healing's constraint); the argmax over them must be the exact model's."""


class TransformersPass:
    """``ModelPass`` over a transformers causal LM and a ``GrowingLayer`` cache."""

    cost_prior = None  # fp32 CPU and accelerators: the device defaults in drafters/length.py

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def new_cache(self) -> Any:
        from decoding.growing_cache import new_cache

        return new_cache(self.model.config)

    def __call__(
        self,
        tokens: Sequence[int],
        cache: Any,
        keep: int = 0,
        allowed: Sequence[torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """Every logit as the model computes it (``allowed`` changes nothing)."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0]
