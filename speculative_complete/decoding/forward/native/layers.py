"""Every layer of a pass in one call to the native kernels (``klayers.c``).

Why: on one row a layer is eight calls (two norms, four products, the attention, the SwiGLU),
and from Python each costs microseconds of its own (arguments, an output tensor) against a
product of a few dozen; ``lsq_layers`` makes the same calls in C, on the same buffers, so every
row comes out bit for bit as on the per-call path (``tests/decoding/forward/test_native.py`` compares both).
Taken where every layer's four products are ``NativeLinear``s and no head has a norm of its own
(Qwen3's q and k norms stay on the per-call path).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Protocol

import torch

from speculative_complete.decoding.forward.native.library import Kernels
from speculative_complete.decoding.forward.native.linear import NativeLinear


class ModelShape(Protocol):
    """What is read of ``llama.LlamaShape`` (a protocol: ``llama`` imports this module)."""

    @property
    def dim(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def attention_dim(self) -> int: ...
    @property
    def ffn(self) -> int: ...
    @property
    def norm_eps(self) -> float: ...


class LayerWeights(Protocol):
    """What is read of ``llama.LlamaLayer``."""

    @property
    def attn_norm(self) -> torch.Tensor: ...
    @property
    def ffn_norm(self) -> torch.Tensor: ...
    @property
    def qkv(self) -> torch.nn.Module: ...
    @property
    def out(self) -> torch.nn.Module: ...
    @property
    def gate_up(self) -> torch.nn.Module: ...
    @property
    def down(self) -> torch.nn.Module: ...
    @property
    def qkv_bias(self) -> torch.Tensor | None: ...
    @property
    def q_norm(self) -> torch.Tensor | None: ...
    @property
    def k_norm(self) -> torch.Tensor | None: ...


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

    def __init__(self, kernels: Kernels, layers: Sequence[LayerWeights], shape: ModelShape) -> None:
        self.kernels, self.shape = kernels, shape
        self.dims = Dims(shape.dim, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.norm_eps)
        self._kept: list[torch.Tensor] = []
        self.layers = (Layer * len(layers))(*(self._layer(layer) for layer in layers))
        products = [
            (product, width)
            for layer in layers
            for product, width in (
                (layer.qkv, shape.dim),
                (layer.out, shape.attention_dim),
                (layer.gate_up, shape.dim),
                (layer.down, shape.ffn),
            )
        ]
        self.row_bytes = max(
            kernels.activation_row_bytes(kind, width)
            for product, width in products
            if isinstance(product, NativeLinear)
            for kind in product.group.distinct_kinds
        )
        self._work = torch.empty(0)

    @staticmethod
    def covers(layers: Sequence[LayerWeights]) -> bool:
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

    def _layer(self, layer: LayerWeights) -> Layer:
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

    def __call__(self, h: torch.Tensor, rotary: torch.Tensor, kv: torch.Tensor, start: int) -> torch.Tensor:
        """``h`` (rows, dim) through every layer, the pass's keys and values into ``kv`` (a
        ``KVCache``'s buffer: layers, 2 kv_heads, capacity, head_dim) at ``start``..;
        ``rotary`` as ``Kernels.attention`` takes it."""
        capacity = kv.shape[2]
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
            kv.data_ptr(),
            capacity,
            work.data_ptr(),
            k.scratch(rows * self.row_bytes).data_ptr(),
            k.scores(capacity).data_ptr(),
        )
        if done != 0:
            raise RuntimeError(f"native layers failed ({done})")
        return h
