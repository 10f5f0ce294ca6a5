"""A transformers ``DynamicCache`` whose layers append into spare room (``GrowingLayer``).

Only transformers' forward (``speculative_complete/decoding/forward/model_pass.py``) uses it; kept
apart from ``kv_cache.py`` so that a server on the lean forward never imports transformers' model
machinery (and its memory).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into spare capacity instead of concatenating.

    The stock layer ``torch.cat``s the whole cache on every pass: on the CPU that copy of every
    layer's keys and values was a tenth of a decode step's profile at a few hundred tokens of
    context (``benchmarks/README.md``), and it grows with the context. Here keys and values are
    views of a buffer with room to spare, so a pass writes only its new rows; the buffer is
    reallocated (by a quarter, at least ``SPARE`` tokens) when it is full. Cropping stays the stock
    view-slicing: the rows past the view are simply overwritten by the next update. transformers
    has no such layer (``StaticLayer`` preallocates the model's whole context and attends over all
    of it).
    """

    SPARE = 128

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def _holds_views(self, keys: torch.Tensor) -> bool:
        """Whether ``self.keys`` is still a view of the buffer (not replaced by another method)."""
        buffer = self._key_buffer
        return (
            buffer is not None
            and self.keys is not None
            and self.keys.data_ptr() == buffer.data_ptr()
            and self.keys.shape[:-2] == keys.shape[:-2]
            and self.values is not None
            and self._value_buffer is not None
            and self.values.data_ptr() == self._value_buffer.data_ptr()
        )

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        *args,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.get_seq_length()
        need = held + key_states.shape[-2]
        if held == 0:
            reusable = self._key_buffer is not None and self._key_buffer.shape[:-2] == key_states.shape[:-2]
        else:
            reusable = self._holds_views(key_states)
        if not reusable or self._key_buffer is None or need > self._key_buffer.shape[-2]:
            capacity = need + max(self.SPARE, need // 4)
            keys = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
            values = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
            if held:
                keys[..., :held, :] = self.keys
                values[..., :held, :] = self.values
            self._key_buffer, self._value_buffer = keys, values
        self._key_buffer[..., held:need, :] = key_states
        self._value_buffer[..., held:need, :] = value_states
        self.keys = self._key_buffer[..., :need, :]
        self.values = self._value_buffer[..., :need, :]
        return self.keys, self.values


def new_cache(config: object) -> DynamicCache:
    """An empty ``DynamicCache`` for ``config`` whose full-attention layers are ``GrowingLayer``s
    (sliding-window and other special layers are left as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
