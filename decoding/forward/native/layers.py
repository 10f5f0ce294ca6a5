"""Every layer of a pass in one call to the native kernels (``klayers.c``).

Why: on one row a layer is eight calls (two norms, four products, the attention, the SwiGLU),
and from Python each costs microseconds of its own (arguments, an output tensor) against a
product of a few dozen; ``lsq_layers`` makes the same calls in C, on the same buffers, so every
row comes out bit for bit as on the per-call path (``tests/test_native.py`` compares both).
Taken where every layer's four products are ``NativeLinear``s and no head has a norm of its own
(Qwen3's q and k norms stay on the per-call path).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from decoding.forward.native import Kernels, NativeLinear

if TYPE_CHECKING:
    from decoding.forward.llama import KVCache, LlamaLayer, LlamaShape

KEPT_ROWS = 16  # passes of at most this many rows reuse one work buffer


class Group(ctypes.Structure):
    """``lsq_group``: weights side by side."""

    _fields_ = [
        ("count", ctypes.c_int),
        ("types", ctypes.c_void_p),
        ("ws", ctypes.c_void_p),
        ("n_outs", ctypes.c_void_p),
        ("n_out", ctypes.c_int64),
    ]


class Layer(ctypes.Structure):
    """``lsq_layer``: a layer's products, norms, biases and q/k column order."""

    _fields_ = [
        ("qkv", Group),
        ("out", Group),
        ("gate_up", Group),
        ("down", Group),
        ("attn_norm", ctypes.c_void_p),
        ("ffn_norm", ctypes.c_void_p),
        ("qkv_bias", ctypes.c_void_p),
        ("qkv_order", ctypes.c_void_p),
    ]


class Dims(ctypes.Structure):
    """``lsq_dims``: the model's widths."""

    _fields_ = [
        ("dim", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("ffn", ctypes.c_int64),
        ("eps", ctypes.c_float),
    ]


def _group(linear: NativeLinear) -> Group:
    g = linear.group
    return Group(
        g.count,
        ctypes.addressof(g.kinds),
        ctypes.addressof(g.addresses),
        ctypes.addressof(g.out_rows),
        linear.out_features,
    )


class NativeLayers:
    """A model's layers as ``lsq_layers`` takes them, made once; the tensors whose addresses
    they hold are kept alive here."""

    def __init__(self, kernels: Kernels, layers: Sequence[LlamaLayer], shape: LlamaShape) -> None:
        self.kernels, self.shape = kernels, shape
        self.dims = Dims(shape.dim, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.norm_eps)
        self._kept: list[torch.Tensor] = []
        self.layers = (Layer * len(layers))(*(self._layer(layer) for layer in layers))
        widths = {"qkv": shape.dim, "out": shape.attention_dim, "gate_up": shape.dim, "down": shape.ffn}
        self.row_bytes = max(
            kernels.activation_row_bytes(kind, widths[name])
            for layer in layers
            for name in widths
            for kind in getattr(layer, name).group.distinct_kinds
        )
        self._work = torch.empty(0)

    @staticmethod
    def covers(layers: Sequence[LlamaLayer]) -> bool:
        """Whether every layer's products run on the native kernels, and no head has its own norm."""
        return all(
            all(isinstance(m, NativeLinear) for m in (layer.qkv, layer.out, layer.gate_up, layer.down))
            and all(m.order is None for m in (layer.out, layer.gate_up, layer.down))
            and layer.q_norm is None
            and layer.k_norm is None
            for layer in layers
        )

    def _address(self, tensor: torch.Tensor | None, dtype: torch.dtype) -> int | None:
        if tensor is None:
            return None
        kept = tensor.to(dtype).contiguous()
        self._kept.append(kept)
        return kept.data_ptr()

    def _layer(self, layer: LlamaLayer) -> Layer:
        return Layer(
            _group(layer.qkv),
            _group(layer.out),
            _group(layer.gate_up),
            _group(layer.down),
            self._address(layer.attn_norm, torch.float32),
            self._address(layer.ffn_norm, torch.float32),
            self._address(layer.qkv_bias, torch.float32),
            self._address(layer.qkv.order, torch.int64),
        )

    def _work_for(self, floats: int, rows: int) -> torch.Tensor:
        """The pass's work buffer: kept between passes of a few rows (steps, verification), a
        prefill's its own (tens of MB on a wide model, given back with the pass)."""
        if rows > KEPT_ROWS:
            return torch.empty(floats)
        if self._work.numel() < floats:
            self._work = torch.empty(floats)
        return self._work

    def __call__(self, h: torch.Tensor, rotary: torch.Tensor, cache: KVCache, start: int) -> torch.Tensor:
        """``h`` (rows, dim) through every layer, the pass's keys and values into ``cache`` at
        ``start``..; ``rotary`` as ``Kernels.attention`` takes it."""
        k, rows = self.kernels, h.shape[0]
        h = h.float().clone(memory_format=torch.contiguous_format)
        factors = torch.view_as_real(rotary.contiguous())
        work = self._work_for(k.lib.lsq_layers_work(ctypes.byref(self.dims), rows), rows)
        done = k.lib.lsq_layers(
            self.layers,
            len(self.layers),
            ctypes.byref(self.dims),
            h.data_ptr(),
            rows,
            start,
            factors.data_ptr(),
            cache.kv.data_ptr(),
            cache.capacity,
            work.data_ptr(),
            k.scratch(rows * self.row_bytes).data_ptr(),
            k.scores(cache.capacity).data_ptr(),
        )
        if done != 0:
            raise RuntimeError(f"native layers failed ({done})")
        return h
