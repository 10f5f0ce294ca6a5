"""llama.cpp's CPU kernels for the lean forward's products, where they are built (``build.py``).

Why: torch's 4-bit kernel is the only quantized product torch has on the CPU. On AVX2 it is no
faster than fp32, it takes no 16-value sub-blocks (Q6_K, Q3_K, Q2_K: padded terms, at 2.5 bytes a
weight), and its packed copy doubles the weights' memory. llama.cpp's kernels multiply a GGUF's
own blocks where they lie in the memory-mapped file, with activations quantized per block as
llama.cpp quantizes them, tuned for each ISA. ``lsqmm.c`` calls them one output at a time where
a type has nothing faster; ``krows.c`` (a weight block unpacked once for four rows) and, on
AVX-512, ``kpairs.c`` (Q4_K and Q6_K, two weight rows to a register) sum each output exactly as
they sum it alone, asking for the weights ahead of their use, so each output is computed the
same whatever the rows of a pass:
batch-invariant by construction, as the lean forward needs. Where rounding enters: the
activations, quantized to the weight type's activation type (Q8_0, Q8_1 or Q8_K blocks) per row.

Chosen wherever they are built (``kernels_for_files``), for every file and CPU. A narrow model of
Q4_0/Q4_1/Q8_0 blocks (the default's, 576 wide) once stayed on torch's batched 4-bit kernel on an
AVX-512 CPU, whose passes over several rows beat these products there. Since its greedy choices
are certified (issue 38), each of its passes makes a second product of the output layer's size
(Q8_0's second 4-bit term), and the keystroke replay on an AVX-512 Xeon answered pauses sooner
on these kernels at p50 and p95 (``benchmarks/README.md``, 2026-12-05); a cold prefill of a long
prompt in one pass is what torch's kernel still does faster. ``LSP_NATIVE=1`` or ``0`` forces either;
``LSP_NATIVE_VARIANT=avx2`` loads the AVX2 build; ``LSP_NATIVE_PACK=0`` keeps every weight on the
file's blocks (``kpacked.c`` packs none: what ``benchmarks/models_bench.py`` compares). Loaded once
per process from the cached build.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from decoding.forward.native.build import built_library
from decoding.forward.quant.layers import CertifiedOutputLayer, best_allowed

log = logging.getLogger(__name__)

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
        lib.lsq_attention.argtypes = [_POINTER] * 4 + [_I64] * 3 + [_INT] * 3 + [_POINTER] * 3
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
        self._scores = torch.empty(0)  # attention's, a row of keys for each thread
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
        """Attention's scratch: a row of ``capacity`` keys for each thread."""
        if self._scores.numel() < self.threads * capacity:
            self._scores = torch.empty(self.threads * capacity)
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


@functools.cache
def built_kernels(variant: str = "native") -> Kernels | None:
    """The library of ``variant`` where it is built, whatever ``LSP_NATIVE`` says (its tests)."""
    path = built_library(variant)
    if path is None:
        return None
    return Kernels(str(path), int(os.environ.get("LSP_NATIVE_THREADS", 0)) or (os.cpu_count() or 1))


@functools.cache
def kernels() -> Kernels | None:
    """The native kernels where asked for everywhere (``LSP_NATIVE=1``) and built, else None."""
    return _serving() if os.environ.get("LSP_NATIVE") == "1" else None


def kernels_for_files() -> Kernels | None:
    """The native kernels for a GGUF's products, or None for torch's: ``LSP_NATIVE=0`` never,
    else wherever they are built (see the module's docstring for why every file). Decided by the
    build and the setting, not by a timed probe, so that one file always gives the same output on
    one machine."""
    if os.environ.get("LSP_NATIVE", "auto") == "0":
        return None
    return _serving()


def _serving() -> Kernels | None:
    """The built kernels of ``LSP_NATIVE_VARIANT``, torch set to one thread beside them."""
    variant = os.environ.get("LSP_NATIVE_VARIANT", "native")
    try:
        loaded = built_kernels(variant)
    except OSError as exc:
        log.warning("native kernels (%s) cannot be loaded (%s): torch's kernels serve", variant, exc)
        return None
    if loaded is None:
        log.info(
            "native kernels (%s) not built: torch's kernels serve "
            "(python -m decoding.forward.native --build)",
            variant,
        )
        return None
    # The kernels' threads spin between products; torch's own pool would spin against them on
    # the same cores (a decode step took ten times as long), and what torch still runs of a pass
    # (norms, rotary, small copies) is too small to split anyway.
    torch.set_num_threads(1)
    log.info("native kernels: %s, %d threads (torch's own: 1)", loaded.path, loaded.threads)
    return loaded


Q4_K = 12  # GGML's type number
PACKED = 0x10000  # added to a type: the products read the rows packed (``kpacked.h``'s LSQ_PACKED)


@dataclass(frozen=True)
class Weight:
    """One weight in a GGUF's own blocks: ``blocks`` (out, bytes per row) of GGML type ``kind``;
    ``packed``: the same rows packed for the products (``Kernels.pack``), or None: the products
    read the blocks. Rows looked up one by one (embeddings, exact logits) read the blocks."""

    kind: int
    blocks: np.ndarray
    width: int  # inputs per row
    packed: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return len(self.blocks)

    @property
    def product_kind(self) -> int:
        """The type the products are told: ``kind``, marked ``PACKED`` where packed."""
        return self.kind | PACKED if self.packed is not None else self.kind

    @functools.cached_property
    def address(self) -> int:
        """Where the products read the rows (numpy's ``ctypes.data`` costs microseconds a call)."""
        return self.packed.data_ptr() if self.packed is not None else self.blocks.ctypes.data


class WeightGroup:
    """Weights side by side as ``lsq_matmul_many`` takes them: their types, addresses and row
    counts as C arrays, made once (a decode step calls it four times a layer)."""

    def __init__(self, weights: Sequence[Weight]) -> None:
        self.count = len(weights)
        self.kinds = (ctypes.c_int * self.count)(*(w.product_kind for w in weights))
        self.addresses = (ctypes.c_void_p * self.count)(*(w.address for w in weights))
        self.out_rows = (ctypes.c_int64 * self.count)(*(w.out_features for w in weights))
        self.distinct_kinds = tuple(dict.fromkeys(w.product_kind for w in weights))


class NativeLinear(torch.nn.Module):
    """``x @ W.T`` for weights in a GGUF's own blocks (memory-mapped, never copied), on the
    native kernels; several weights side by side (q, k and v) fill one output, each in its type.
    ``order`` permutes the output's columns (q's and k's rotate-half rows taken to adjacent
    pairs): the same values as the permuted rows' product, as each output is its row's alone,
    without a copy of the rows beside the file's (which stay mapped, and resident once read)."""

    def __init__(
        self, kernels: Kernels, weights: Sequence[Weight], order: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.kernels, self.weights, self.order = kernels, list(weights), order
        self.in_features = self.weights[0].width
        self.out_features = sum(w.out_features for w in self.weights)
        self.group = WeightGroup(self.weights)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T``, plus ``residual`` (rows, out) where given, in the same call."""
        x = x.float().contiguous()
        out = torch.empty(x.shape[0], self.out_features)
        if residual is not None:
            assert self.order is None  # the sum is of the product's own columns
            residual = residual.contiguous()
        self.kernels.products(self.group, x, out, residual)
        return out if self.order is None else out[:, self.order]

    # Called as a function, without ``Module.__call__``'s hook handling: a decode step makes
    # four of these calls a layer, and nothing hooks them.
    __call__ = forward

    def nbytes(self) -> int:
        return sum(w.blocks.nbytes if w.packed is None else w.packed.nbytes for w in self.weights)


class NativeOutputLayer(CertifiedOutputLayer):
    """The output layer on the native kernels (``CertifiedOutputLayer``): every logit is their product
    of the file's blocks with the activations quantized per block, the candidates' recomputed
    in fp32 from rows ggml dequantizes. The bound: a logit differs from the exact one by at most
    its row's norm times the norm of what quantizing the activations changed (Cauchy-Schwarz),
    plus the kernels' float sums (a relative (n/32 + 8) 2^-22 of |w||x|)."""

    def __init__(self, kernels: Kernels, weight: Weight) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.out_features, weight.width
        self.norms = kernels.row_norms(weight.kind, weight.blocks, weight.width)
        self.norm_max = self.norms.max()
        # Packed rows are summed in another order (kpacked.c): within the bound above where each
        # weight is one product (Q6_K); Q4_K's two parts (d sc q less dmin m) round by their own
        # magnitudes, which can exceed the weight's, so its rows stay on ggml's sums.
        packs = weight.kind != Q4_K
        self.kernels, self.weight = kernels, kernels.pack(weight) if packs else weight
        self.linear = NativeLinear(kernels, [self.weight])

    @staticmethod
    def fits(kernels: Kernels, weight: Weight) -> bool:
        """Whether the bound can be told for this type (not where activations are Q8_1, whose
        block sums are rounded again)."""
        probe = torch.ones(1, weight.width)
        return kernels.supports(weight.kind) and kernels.activation_error(weight.kind, probe) is not None

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.kernels.rows(self.weight.kind, self.weight.blocks, index, self.in_features)

    def _approximate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits, and each row's slack (``_slack``: both bounds need it)."""
        return self.linear(x), self._slack(x)

    def _top(self, ranking: torch.Tensor, k: int) -> Any:
        return self.kernels.top(ranking, k)

    def _slack(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, 1): the bound per unit of a row's norm."""
        error = self.kernels.activation_error(self.weight.kind, x.contiguous())
        assert error is not None  # ``fits``
        sums = (self.in_features / 32 + 8) * 2**-22 * (x.norm(dim=1) + error)
        return ((error + sums) * 1.01)[:, None]

    def _loose_bound(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.norm_max * state[:, 0] + 1e-6

    def _contenders(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        rankings: list[torch.Tensor],
        unsure: torch.Tensor,
        top: torch.Tensor,
        exact: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The base class's contenders, each token's bound its row's norm times the row's slack,
        plus 1e-6: one C pass a row and ranking, where torch made a dozen passes over the
        vocabulary (at every step the loose bound leaves unsure: most steps of a random prompt)."""
        slack = state[unsure, 0].tolist()
        bests = [best.tolist() for best in best_allowed(rankings, unsure, top, exact)]
        rows, ids = [], []
        for i, row in enumerate(unsure.tolist()):
            found: set[int] = set()
            for ranking, best in zip(rankings, bests, strict=True):
                found.update(self.kernels.contenders(ranking[row], self.norms, slack[i], best[i]).tolist())
            outside = sorted(found.difference(top[row].tolist()))  # a few dozen ids
            rows += [row] * len(outside)
            ids += outside
        return torch.tensor(rows, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)

    def nbytes(self) -> int:
        return self.linear.nbytes() + self.norms.nbytes
