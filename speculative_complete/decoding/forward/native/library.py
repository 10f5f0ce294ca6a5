"""The built library's functions bound through ctypes (``Kernels``): products of a GGUF's own
blocks, norms, attention, SwiGLU, row lookups, top-k and the activations' rounding, each one C
call, with the scratch buffers a decode step's hundreds of small calls reuse.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from speculative_complete.decoding.forward.native.weights import Weight, WeightGroup

_POINTER, _SIZE, _I64, _INT = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int


class Kernels:
    """The loaded library: which GGUF types it multiplies, products, rows, activation error."""

    def __init__(self, path: str, threads: int) -> None:
        lib = ctypes.CDLL(path)
        lib.lsq_init.argtypes = [_INT]
        lib.lsq_row_bytes.restype, lib.lsq_row_bytes.argtypes = _SIZE, [_INT, _I64]
        lib.lsq_vec_dot_type.argtypes = [_INT]
        lib.lsq_supports.argtypes = [_INT]
        lib.lsq_matmul.argtypes = [_INT, _POINTER, _I64, _I64, _POINTER, _I64, _POINTER, _I64, _POINTER]
        lib.lsq_matmul_reference.argtypes = lib.lsq_matmul.argtypes
        many = [_INT, _POINTER, _POINTER, _POINTER]  # count, types, addresses, rows of each
        lib.lsq_matmul_many.argtypes = many + [_I64, _POINTER, _I64, _POINTER, _I64, _POINTER, _POINTER]
        lib.lsq_rms_norm.argtypes = [_POINTER, _POINTER, _I64, _I64, ctypes.c_float, _POINTER]
        lib.lsq_rows.argtypes = [_INT, _POINTER, _I64, _POINTER, _I64, _POINTER]
        lib.lsq_row_norms.argtypes = [_INT, _POINTER, _I64, _I64, _I64, _POINTER]
        lib.lsq_activation_error.argtypes = [_INT, _POINTER, _I64, _I64, _POINTER, _POINTER, _POINTER]
        lib.lsq_activation_rows.argtypes = [_INT, _POINTER, _I64, _I64, _POINTER, _POINTER]
        lib.lsq_quantize_row.argtypes = [_INT, _POINTER, _I64, _POINTER, _INT]
        lib.lsq_attention.argtypes = [_POINTER] * 4 + [_I64] * 3 + [_INT] * 3 + [_POINTER] * 3
        lib.lsq_attention_scratch.restype, lib.lsq_attention_scratch.argtypes = _I64, [_I64]
        lib.lsq_swiglu.argtypes = [_POINTER, _I64, _I64, _POINTER]
        lib.lsq_top.argtypes = [_POINTER, _I64, _I64, _I64, _POINTER, _POINTER]
        lib.lsq_contenders.restype = _I64
        lib.lsq_contenders.argtypes = [_POINTER, _POINTER, ctypes.c_float, ctypes.c_float, _I64, _POINTER]
        lib.lsq_layers_work.restype, lib.lsq_layers_work.argtypes = _I64, [_POINTER, _I64]
        lib.lsq_layers.argtypes = [_POINTER, _INT, _POINTER, _POINTER, _I64, _I64, _POINTER, _POINTER, _I64]
        lib.lsq_layers.argtypes += [_POINTER] * 3
        lib.lsq_packed_bytes.restype, lib.lsq_packed_bytes.argtypes = _SIZE, [_INT, _I64, _I64]
        lib.lsq_pack.argtypes = [_INT, _POINTER, _I64, _I64, _I64, _I64, _POINTER]
        lib.lsq_init(threads)
        self.lib, self.path, self.threads = lib, path, lib.lsq_threads()
        # Kept between products (the library runs one at a time): a decode step makes hundreds of
        # small ones, where these lookups and allocations cost as much as a product's own work.
        self._scratch = torch.empty(0, dtype=torch.uint8)
        self._activation_bytes: dict[tuple[int, int], int] = {}
        self._scores = torch.empty(0)  # attention's scores, for each thread
        self._ids = torch.empty(0, dtype=torch.int64)  # contenders'

    def supports(self, kind: int) -> bool:
        return bool(self.lib.lsq_supports(int(kind)))

    def pack(self, weight: Weight) -> Weight:
        """``weight`` with its rows packed for this build's interleaved kernels (``kpacked.c``),
        where it packs the type and the rows fill whole groups; else ``weight`` itself. The
        groups are split between ``threads`` Python threads (the call lets go of the GIL)."""
        kind, rows, width = int(weight.kind), weight.out_features, weight.width
        size = self.lib.lsq_packed_bytes(kind, rows, width)
        if not size or os.environ.get("LSP_NATIVE_PACK") == "0":
            return weight
        packed = torch.empty(size, dtype=torch.uint8)  # torch's allocations are 64-byte aligned
        groups = rows // self.lib.lsq_packed_rows()
        shares = np.linspace(0, groups, self.threads + 1).astype(np.int64).tolist()

        def pack(first: int, last: int) -> int:
            source = weight.blocks.ctypes.data
            return self.lib.lsq_pack(kind, source, rows, width, first, last - first, packed.data_ptr())

        with ThreadPoolExecutor(self.threads) as pool:
            if any(pool.map(pack, shares[:-1], shares[1:])):
                raise RuntimeError(f"packing {rows} rows of type {kind} failed")
        return replace(weight, packed=packed)

    def matmul(
        self,
        kind: int,
        blocks: np.ndarray,
        x: torch.Tensor,
        out: torch.Tensor,
        column: int,
        reference: bool = False,
    ) -> None:
        """``out[:, column:column + len(blocks)] = x @ W.T`` for W the rows ``blocks`` (rows,
        bytes per row) of type ``kind``; ``x`` fp32 contiguous (rows, in), ``out`` fp32
        contiguous. ``reference``: ggml's own vec_dot for every output, one thread (what the
        faster kernels must equal bit for bit)."""
        self.product(int(kind), blocks.ctypes.data, len(blocks), x, out, column, reference)

    def products(
        self, group: WeightGroup, x: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None = None
    ) -> None:
        """``out = x @ W.T`` for W the ``group``'s weights side by side, in one call (``x`` quantized
        once for weights of one activation type): each output as ``product``'s, plus
        ``residual``'s element where given (out's shape, contiguous)."""
        rows, n_in = x.shape
        for kind in group.distinct_kinds:
            self._reserve_scratch(kind, rows, n_in)
        done = self.lib.lsq_matmul_many(
            group.count,
            group.kinds,
            group.addresses,
            group.out_rows,
            n_in,
            x.data_ptr(),
            rows,
            out.data_ptr(),
            out.shape[1],
            self._scratch.data_ptr(),
            None if residual is None else residual.data_ptr(),
        )
        if done != 0:
            raise RuntimeError(f"native products of types {list(group.kinds)} failed ({done})")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Each row of ``x`` (rows, n) fp32 contiguous over its root mean square, times ``weight``:
        one C call where torch's composite norm is several ops (most of its time on one row)."""
        x = x.contiguous()
        out = torch.empty_like(x)
        self.lib.lsq_rms_norm(x.data_ptr(), weight.data_ptr(), x.shape[0], x.shape[1], eps, out.data_ptr())
        return out

    def _reserve_scratch(self, kind: int, rows: int, n_in: int) -> None:
        """Room in the scratch for ``rows`` activation rows quantized for ``kind``'s products."""
        self.scratch(rows * self.activation_row_bytes(kind, n_in))

    def product(
        self,
        kind: int,
        address: int,
        out_rows: int,
        x: torch.Tensor,
        out: torch.Tensor,
        column: int,
        reference: bool = False,
    ) -> None:
        """``matmul`` for the ``out_rows`` weight rows of type ``kind`` at ``address``."""
        rows, n_in = x.shape
        self._reserve_scratch(kind, rows, n_in)
        product = self.lib.lsq_matmul_reference if reference else self.lib.lsq_matmul
        y = out.data_ptr() + column * out.element_size()
        done = product(
            kind, address, out_rows, n_in, x.data_ptr(), rows, y, out.shape[1], self._scratch.data_ptr()
        )
        if done != 0:
            raise RuntimeError(f"native product of type {kind} failed ({done})")

    def attention(
        self, qkv: torch.Tensor, rotary: torch.Tensor, cache: torch.Tensor, start: int
    ) -> torch.Tensor:
        """A layer's attention for the rows of ``qkv`` (rows, heads + 2 kv_heads, dim) fp32, the
        projected heads at positions ``start``..: q and k heads times their ``rotary`` factors
        (rows, heads + kv_heads, dim / 2) complex, the query heads' scale in them; k and v written
        to the layer's ``cache`` (2 kv_heads, capacity, dim: keys, then values); each row
        attending to the keys up to its own position. (rows, heads, dim)."""
        rows, all_heads, dim = qkv.shape
        kv_heads, capacity = cache.shape[0] // 2, cache.shape[1]
        heads = all_heads - 2 * kv_heads
        qkv, rotary = qkv.contiguous(), torch.view_as_real(rotary.contiguous())
        out, q = torch.empty(rows, heads, dim), torch.empty(rows, heads, dim)
        scores = self.scores(capacity)
        done = self.lib.lsq_attention(
            qkv.data_ptr(),
            rotary.data_ptr(),
            cache.data_ptr(),
            cache[kv_heads:].data_ptr(),
            capacity,
            rows,
            start,
            heads,
            kv_heads,
            dim,
            out.data_ptr(),
            q.data_ptr(),
            scores.data_ptr(),
        )
        if done != 0:
            raise RuntimeError(f"native attention failed ({done})")
        return out

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for ``gate_up`` (rows, 2 ffn), each row's gate then its up; fp32."""
        gate_up = gate_up.float().contiguous()
        rows, ffn = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, ffn)
        self.lib.lsq_swiglu(gate_up.data_ptr(), rows, ffn, out.data_ptr())
        return out

    def top(self, x: torch.Tensor, k: int) -> Any:
        """Each row of ``x`` (rows, n) fp32's ``k`` highest values and their indices, highest
        first, equal values by lower index: as ``torch.topk`` returns them."""
        x = x.contiguous()
        rows, n = x.shape
        values, indices = torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
        if self.lib.lsq_top(x.data_ptr(), rows, n, k, values.data_ptr(), indices.data_ptr()) != 0:
            raise ValueError(f"no top {k} of {n} values")
        return torch.return_types.topk((values, indices))

    def scores(self, capacity: int) -> torch.Tensor:
        """Attention's scratch: rows of ``capacity`` scores for each thread."""
        floats = self.lib.lsq_attention_scratch(capacity)
        if self._scores.numel() < floats:
            self._scores = torch.empty(floats)
        return self._scores

    def scratch(self, row_bytes: int) -> torch.Tensor:
        """The products' scratch, ``row_bytes`` long at least."""
        if self._scratch.numel() < row_bytes:
            self._scratch = torch.empty(row_bytes, dtype=torch.uint8)
        return self._scratch

    def activation_row_bytes(self, kind: int, n_in: int) -> int:
        """Bytes of one activation row of ``n_in`` values quantized for ``kind``'s products."""
        key = (kind, n_in)
        if key not in self._activation_bytes:
            self._activation_bytes[key] = self.lib.lsq_row_bytes(self.lib.lsq_vec_dot_type(kind), n_in)
        return self._activation_bytes[key]

    def contenders(self, row: torch.Tensor, norms: torch.Tensor, slack: float, best: float) -> torch.Tensor:
        """The ids of ``row``'s tokens (fp32 contiguous) whose logit plus its bound (``norms``
        times ``slack``, plus 1e-6) reaches ``best`` and is above -inf, in order."""
        n = row.shape[0]
        if self._ids.numel() < n:
            self._ids = torch.empty(n, dtype=torch.int64)
        row = row.contiguous()
        count = self.lib.lsq_contenders(
            row.data_ptr(), norms.data_ptr(), slack, best, n, self._ids.data_ptr()
        )
        return self._ids[:count].clone()

    def rows(self, kind: int, blocks: np.ndarray, ids: torch.Tensor, width: int) -> torch.Tensor:
        """Rows ``ids`` of the weight ``blocks``, dequantized to fp32: (*ids.shape, width)."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(len(flat), width)
        if (
            self.lib.lsq_rows(
                int(kind), blocks.ctypes.data, width, flat.data_ptr(), len(flat), out.data_ptr()
            )
            != 0
        ):
            raise RuntimeError(f"no dequantization for type {kind}")
        return out.view(*ids.shape, width)

    def row_norms(self, kind: int, blocks: np.ndarray, width: int) -> torch.Tensor:
        """(len(blocks),): each weight row's norm, dequantized as ``rows`` does, rounded up; the
        rows split between ``threads`` Python threads (the call lets go of the GIL), as a
        150k-row output layer's norms are a good part of a load."""
        count = len(blocks)
        out = torch.empty(count)
        shares = np.linspace(0, count, self.threads + 1).astype(np.int64)

        def norms(first: int, last: int) -> int:
            address = out.data_ptr() + first * out.element_size()
            return self.lib.lsq_row_norms(int(kind), blocks.ctypes.data, width, first, last - first, address)

        with ThreadPoolExecutor(self.threads) as pool:
            done = list(pool.map(norms, shares[:-1].tolist(), shares[1:].tolist()))
        if any(done):
            raise RuntimeError(f"no dequantization for type {kind}")
        return out

    def activation_rows(self, kind: int, x: torch.Tensor) -> torch.Tensor | None:
        """``x`` (rows, n) fp32 as the products with ``kind``'s rows see it: quantized to their
        activation type and back (what the tests multiply exactly); None where that cannot be told."""
        x = x.contiguous()
        rows, n_in = x.shape
        out = torch.empty(rows, n_in)
        row_bytes = self.lib.lsq_row_bytes(self.lib.lsq_vec_dot_type(int(kind)), n_in)
        scratch = torch.empty(row_bytes + 64, dtype=torch.uint8)
        done = self.lib.lsq_activation_rows(
            int(kind), x.data_ptr(), n_in, rows, out.data_ptr(), scratch.data_ptr()
        )
        return out if done == 0 else None

    def quantized_row(self, dot_type: int, x: torch.Tensor, reference: bool = False) -> bytes:
        """``x`` (n,) fp32 quantized to the activation type ``dot_type`` as the products quantize
        it, or with ``reference`` by ggml's own function: the blocks' bytes."""
        x = x.float().contiguous()
        out = torch.zeros(self.lib.lsq_row_bytes(int(dot_type), x.numel()), dtype=torch.uint8)
        done = self.lib.lsq_quantize_row(
            int(dot_type), x.data_ptr(), x.numel(), out.data_ptr(), int(reference)
        )
        if done != 0:
            raise ValueError(f"rows of {x.numel()} values cannot be quantized to type {dot_type}")
        return out.numpy().tobytes()

    def activation_error(self, kind: int, x: torch.Tensor) -> torch.Tensor | None:
        """(rows,): the norm of each row of ``x`` less itself as the products with ``kind``'s rows
        see it (quantized and dequantized again); None where that cannot be told."""
        rows, n_in = x.shape
        out = torch.empty(rows)
        scratch = torch.empty(
            self.lib.lsq_row_bytes(self.lib.lsq_vec_dot_type(int(kind)), n_in) + 64, dtype=torch.uint8
        )
        restored = torch.empty(n_in)
        done = self.lib.lsq_activation_error(
            int(kind), x.data_ptr(), n_in, rows, out.data_ptr(), scratch.data_ptr(), restored.data_ptr()
        )
        return out if done == 0 else None
