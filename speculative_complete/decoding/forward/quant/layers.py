"""Linear layers for the lean forward: 4-bit weight-only on torch's CPU kernel, and dense fp32.

Both give every row the same result whatever the number of rows in the pass (batch
invariance), which is what keeps speculative greedy decoding token for token equal to plain
decoding of the same quantized model: a verification pass over k+1 rows must compute each row
exactly as a one-token step would. ``tests/decoding/forward/test_quant.py`` checks it for both layers,
1 to 256 rows.

- ``Int4Linear``: a sum of ``Int4Term``s packed for ``_weight_int4pack_mm_for_cpu``. That kernel
  takes bf16 activations (fp32 and fp16 inputs run a far slower scalar path), accumulates in
  fp32 and returns bf16; its per-row arithmetic does not depend on the row count.
- ``DenseLinear``: fp32 weights computed as ``weight @ x.T``, MKL's path that stays both fast
  for a few rows and batch-invariant (``F.linear`` switches kernels with the row count) from
  ``MIN_DENSE_ROWS`` rows on: fewer rows are padded, because MKL sums a product of few rows in
  another order (below 2 rows on one CPU, below 12 on an AVX-512 one; ``tests/decoding/forward/test_quant.py``
  checks the machine it runs on). On one thread: with two, MKL splits the sums of some shapes
  between its threads by the row count (576x1536 at 100 and 167 rows against 300).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from speculative_complete.decoding.forward.quant.gguf_blocks import (
    GROUP,
    Int4Term,
    QuantTensor,
    quantize_dense,
)

INT4_N_MULTIPLE = 16  # the kernel packs output rows in groups of 16
MIN_DENSE_ROWS = 16  # fewer rows than this are padded (see DenseLinear)


class Int4Linear(torch.nn.Module):
    """``x @ W.T`` for ``W`` a sum of 4-bit terms; input (rows, in), output (rows, out) bf16.

    ``fused`` (every layer but the output layer): the terms' weights side by side along the
    input, and the input repeated once per term (with 16 zeros after each 16 values where a term
    is padded, ``Int4Term``), so the whole sum is one kernel call whose sums run in fp32
    throughout. Unfused, each term is a call of its own (``parts``: the output layer's error
    bound needs each term's result)."""

    def __init__(self, terms: list[Int4Term], fused: bool = True) -> None:
        super().__init__()
        first = terms[0]
        self.out_features = first.q.shape[0]
        self.in_features = first.q.shape[1] // (2 if first.padded else 1)
        self.packed, self.scales, self.layouts = [], [], []
        for group in [terms] if fused else [[term] for term in terms]:
            q = torch.from_numpy(np.concatenate([t.q for t in group], axis=1).astype(np.int32))
            self.packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
            pairs = [np.stack([t.scale.T, t.zero.T], axis=-1) for t in group]  # (groups, out, 2) each
            self.scales.append(
                torch.from_numpy(np.ascontiguousarray(np.concatenate(pairs))).to(torch.bfloat16)
            )
            self.layouts.append(tuple(t.padded for t in group))

    def leading(self, x: torch.Tensor) -> torch.Tensor:
        """The first term's product alone (unfused)."""
        return self._term(x.to(torch.bfloat16), 0)

    def _term(self, x: torch.Tensor, index: int) -> torch.Tensor:
        pieces = [_padded_input(x) if padded else x for padded in self.layouts[index]]
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            joined, self.packed[index], GROUP, self.scales[index]
        )

    def parts(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each packed product, bf16 (their sum is ``forward``'s result)."""
        x = x.to(torch.bfloat16)
        return [self._term(x, index) for index in range(len(self.packed))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.parts(x)
        out = parts[0]
        for part in parts[1:]:
            out = out + part
        return out

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.packed, *self.scales))


def _padded_input(x: torch.Tensor) -> torch.Tensor:
    """(rows, in) -> (rows, 2 in): 16 zeros after each 16 values (a padded term's input)."""
    sixteens = x.reshape(x.shape[0], -1, GROUP // 2)
    return torch.cat([sixteens, torch.zeros_like(sixteens)], dim=2).reshape(x.shape[0], -1)


class DenseLinear(torch.nn.Module):
    """``x @ W.T`` in fp32 with a batch-invariant product; input (rows, in), output (rows, out)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight.float().contiguous()
        self.out_features, self.in_features = self.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        rows = x.shape[0]
        if rows < MIN_DENSE_ROWS:
            x = torch.cat([x, x[:1].expand(MIN_DENSE_ROWS - rows, -1)])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            product = self.weight @ x.t()
        finally:
            torch.set_num_threads(threads)
        return product[:, :rows].t().contiguous()

    def nbytes(self) -> int:
        return self.weight.nbytes


class DenseOutputLayer(DenseLinear):
    """A dense output layer: exact logits for every token, whatever a row allows."""

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The fp32 weights of rows ``index`` (any shape), shape ``(*index.shape, in)``."""
        return self.weight[index]

    def forward(
        self, x: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None = None, greedy_only: bool = False
    ) -> torch.Tensor:
        return super().forward(x)


class CertifiedOutputLayer(torch.nn.Module):
    """An output layer whose logits are approximate, with exact fp32 logits wherever they decide
    anything: the greedy choice is always the exact layer's.

    A fast product (``_approximate``) gives every logit within a known bound of its exact value;
    its ``CANDIDATES`` likeliest tokens per row get their exact logits, computed in fp32 from the
    file's dequantized rows (``rows``), and the other logits stay approximate (sampling sees
    them: plain and speculative sampling alike). A greedy choice must be the exact layer's
    whatever restricts it (token healing allows only the tokens that spell the text still owed,
    ``allowed``, and a rare prefix may allow none of the unrestricted candidates), so the
    candidates are ranked among each row's allowed tokens as well, and where only greedy choices
    are read (``greedy_only``, which the engine passes with each pass of a greedy generation) the
    choice is certified: a token outside the candidates can beat the best one only where its approximate
    logit plus its bound reaches it, and any such token gets its exact logit too. One bound for
    every token of a row (``_loose_bound``) certifies nearly every row for a few reductions; the
    rest are bounded token by token (``_contenders``). Every step is per row, so the layer is
    batch-invariant.
    """

    CANDIDATES = 128  # exact logits a row: sampling reads the top of every row
    # Under ``greedy_only`` only the certified choice is read: a few candidates, and the bound
    # repairs the rare row whose best token lies past them, where 128 rows dequantized to fp32
    # for each row of a verify pass gave exact logits nobody reads.
    GREEDY_CANDIDATES = 16
    out_features: int
    in_features: int

    def __init__(self) -> None:
        super().__init__()
        self.repaired = 0  # tokens whose exact logits a bound asked for (tests and benchmarks read it)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The exact fp32 weights of rows ``index`` (any shape), shape ``(*index.shape, in)``."""
        raise NotImplementedError

    def _approximate(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Approximate fp32 logits (rows, out), and what the bounds need of the product."""
        raise NotImplementedError

    def _loose_bound(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        """(rows,): how far any approximate logit of each row can be from its exact one."""
        raise NotImplementedError

    def _tight_bound(self, x: torch.Tensor, state: Any, rows: torch.Tensor) -> torch.Tensor:
        """(len(rows), out): the same per token, for rows ``rows`` only (``_contenders``')."""
        raise NotImplementedError

    def _top(self, ranking: torch.Tensor, k: int) -> Any:
        """Each row's ``k`` highest logits and their ids, highest first (``torch.topk``'s result)."""
        return ranking.topk(k, dim=-1)

    def _exact(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Exact fp32 logits of tokens ``ids`` (rows, n) for the rows of ``x``."""
        return (self.rows(ids) * x.unsqueeze(1)).sum(-1)

    def forward(
        self, x: torch.Tensor, allowed: Sequence[torch.Tensor | None] | None = None, greedy_only: bool = False
    ) -> torch.Tensor:
        """Logits (rows, out) fp32, exact for each row's candidates, and for its candidates among
        its ``allowed`` tokens (rows past its end, or None: every token); under ``greedy_only``
        exact for every token that could be the row's greedy choice, over all tokens and over
        the allowed ones (healing needs both: the allowed choice, and whether it is the model's
        own)."""
        x = x.float()
        logits, state = self._approximate(x)
        rankings = [logits] if allowed is None else [logits, restricted_logits(logits, allowed)]
        count = min(self.GREEDY_CANDIDATES if greedy_only else self.CANDIDATES, self.out_features)
        ranked = [self._top(ranking, min(count + 1, self.out_features)) for ranking in rankings]
        top = torch.cat([r.indices[:, :count] for r in ranked], dim=1)
        exact = self._exact(top, x)
        unsure = self._unsure(ranked, exact, self._loose_bound(x, state)) if greedy_only else top[:0, 0]
        # Found from the approximate logits, before the candidates' are replaced.
        rows, ids = (
            self._contenders(x, state, rankings, unsure, top, exact) if len(unsure) else (unsure, unsure)
        )
        logits.scatter_(1, top, exact)
        if len(rows):
            self.repaired += len(rows)
            logits[rows, ids] = (self.rows(ids) * x[rows]).sum(-1)
        return logits

    @staticmethod
    def _unsure(ranked: list[Any], exact: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
        """The rows whose greedy choice (among each ranking's candidates, ``exact`` their logits
        in ranking order) the bound for every token at once cannot certify: where the best
        candidate beats the best approximate logit outside them by that bound, no token outside
        can beat it."""
        sure = torch.ones(exact.shape[0], dtype=torch.bool)
        count = exact.shape[1] // len(ranked)
        for i, ranking in enumerate(ranked):
            values = ranking.values
            outside = values[:, count] if values.shape[1] > count else torch.full_like(margin, float("-inf"))
            candidates = exact[:, i * count : (i + 1) * count]
            best = candidates.masked_fill(values[:, :count] == float("-inf"), float("-inf")).amax(1)
            sure &= best >= outside + margin
        return torch.nonzero(~sure).flatten()

    def _contenders(
        self,
        x: torch.Tensor,
        state: Any,
        rankings: list[torch.Tensor],
        unsure: torch.Tensor,
        top: torch.Tensor,
        exact: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, ids): each token outside ``top`` of the ``unsure`` rows whose approximate logit
        plus its own bound reaches, in one of ``rankings``, the best exact candidate that ranking
        allows (-inf in a ranking: a token it excludes); in row, then id order."""
        bound = self._tight_bound(x, state, unsure)
        contenders = torch.zeros(len(unsure), self.out_features, dtype=torch.bool)
        for ranking, best in zip(rankings, best_allowed(rankings, unsure, top, exact), strict=True):
            upper = ranking[unsure] + bound
            contenders |= (upper >= best[:, None]) & (upper > float("-inf"))
        contenders.scatter_(1, top[unsure], False)
        rows, ids = torch.nonzero(contenders, as_tuple=True)
        return unsure[rows], ids


def best_allowed(
    rankings: list[torch.Tensor], unsure: torch.Tensor, top: torch.Tensor, exact: torch.Tensor
) -> list[torch.Tensor]:
    """For each ranking, each ``unsure`` row's best exact logit among its candidates ``top``
    (``exact`` theirs) that the ranking allows."""
    candidates, values = top[unsure], exact[unsure]
    excluded = [ranking[unsure[:, None], candidates] == float("-inf") for ranking in rankings]
    return [values.masked_fill(mask, float("-inf")).amax(1) for mask in excluded]


class QuantizedOutputLayer(CertifiedOutputLayer):
    """The output layer on torch's 4-bit kernel (``CertifiedOutputLayer``).

    The output layer is the largest product of a step (49152 x 576 for SmolLM2): dense fp32 it
    streams 113 MB a step, several times what the 4-bit kernel reads. But the kernel returns bf16,
    whose rounding of logits near 20 (steps of 1/8) changes the greedy choice at some positions
    (``benchmarks/README.md``): hence exact candidates. The bound (``_error_bound``: the kernel's
    weights against the file's, bf16 activations, bf16 results) needs both terms of a Q8_0 layer:
    the leading 4-bit term alone is off by a logit on average, and its bound would send most of the
    vocabulary to exact recomputation (``benchmarks/head_ranking.py`` counts the tokens
    recomputed). The same table serves the input embedding lookup.
    """

    def __init__(self, tensor: QuantTensor) -> None:
        super().__init__()
        assert tensor.terms is not None
        padded = any(t.padded for t in tensor.terms)
        terms = tensor.terms if padded else ranked_terms(tensor.terms)
        self.approx = Int4Linear(terms, fused=False)
        self.out_features, self.in_features = tensor.shape
        values, self.scale, self.zero, self.group = exact_values(tensor.terms)
        self.values = torch.from_numpy(values)
        self.kernel_error, self.kernel_norm = self._kernel_norms(terms)
        self.worst_norms = (self.kernel_error.max(), self.kernel_norm.max())

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        values = self.values[index].float()
        grouped = values.view(*index.shape, -1, self.group) * self.scale[index].unsqueeze(-1)
        if self.zero is not None:
            grouped += self.zero[index].unsqueeze(-1)
        return grouped.view(*index.shape, self.in_features)

    def _kernel_norms(self, terms: list[Int4Term], chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """Per output row: the norm of (the file's weights less the kernel's, whose scales and
        zeros are bf16) and the norm of the kernel's weights; in slices, not a dense copy."""
        error, norm = [], []
        for first in range(0, self.out_features, chunk):
            part = slice(first, first + chunk)
            kernel = sum(
                _bf16_scaled(replace(t, q=t.q[part], scale=t.scale[part], zero=t.zero[part])) for t in terms
            )
            exact = self.rows(torch.arange(first, min(first + chunk, self.out_features)))
            error.append((exact - kernel).norm(dim=1))
            norm.append(kernel.norm(dim=1))
        return torch.cat(error), torch.cat(norm)

    def _error_bound(
        self, x: torch.Tensor, results: torch.Tensor, error: torch.Tensor, norm: torch.Tensor
    ) -> torch.Tensor:
        """How far a kernel logit can be from the exact one, by Cauchy-Schwarz on each source of
        rounding: the kernel's weights (``error``: the norm of the file's weights less the
        kernel's), x rounded to bf16 and the kernel's bf16 weights and fp32 sums (a relative
        2^-8 and n 2^-23 of |w||x|, ``norm`` the kernel weights' norm), and each bf16 result
        and their sum (``results``: their magnitudes added). Per token with the per-token
        tables, (rows, out); for every token at once with their maxima, (rows, 1)."""
        size = x.norm(dim=1, keepdim=True)
        rounded = (x - x.to(torch.bfloat16).float()).norm(dim=1, keepdim=True)
        bound = error * size + norm * (rounded + (2**-8 + self.in_features * 2**-23) * size)
        return (bound + 2**-8 * 1.01 * results) * 1.01 + 1e-6

    @staticmethod
    def _magnitudes(parts: list[torch.Tensor], total: torch.Tensor) -> torch.Tensor:
        """Per token, the magnitudes of each term's bf16 result and of their sum, added."""
        results = total.float().abs()
        for part in parts:
            results += part.float().abs()
        return results

    def _approximate(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        parts = self.approx.parts(x)
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total.float(), (parts, total)

    def _loose_bound(self, x: torch.Tensor, state: Any) -> torch.Tensor:
        parts, total = state
        results = total.float().abs().amax(1, keepdim=True)
        for part in parts:
            results += part.float().abs().amax(1, keepdim=True)
        return self._error_bound(x, results, *self.worst_norms)[:, 0]

    def _tight_bound(self, x: torch.Tensor, state: Any, rows: torch.Tensor) -> torch.Tensor:
        parts, total = state
        results = self._magnitudes([part[rows] for part in parts], total[rows])
        return self._error_bound(x[rows], results, self.kernel_error, self.kernel_norm)

    def nbytes(self) -> int:
        extra = self.zero.nbytes if self.zero is not None else 0
        tables = self.kernel_error.nbytes + self.kernel_norm.nbytes
        return self.approx.nbytes() + self.values.nbytes + self.scale.nbytes + extra + tables


def restricted_logits(logits: torch.Tensor, allowed: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """``logits`` with every token a row does not allow at -inf (rows past ``allowed``, or None:
    all allowed)."""
    restricted = logits.clone()
    for row, ids in enumerate(allowed):
        if ids is not None:
            restricted[row] = float("-inf")
            restricted[row, ids] = logits[row, ids]
    return restricted


def _bf16_scaled(term: Int4Term) -> torch.Tensor:
    """A term's weights as the kernel computes them: its scales and zeros rounded to bf16."""

    def rounded(values: np.ndarray) -> np.ndarray:
        return torch.from_numpy(values).to(torch.bfloat16).float().numpy()

    return torch.from_numpy(Int4Term(term.q, rounded(term.scale), rounded(term.zero), term.padded).dense())


def exact_values(terms: list[Int4Term]) -> tuple[np.ndarray, torch.Tensor, torch.Tensor | None, int]:
    """The weights of one or two terms as int8 values with an fp32 scale and zero per group of
    ``group`` (16 where the terms are padded): ``values * scale + zero`` is their sum, exact but
    for one rounding of the zero. Two terms are a high part at 16 times the scale of a low one
    (Q8_0 split in two, Q5's fifth bit, Q6_K's two high bits): 16 (q_hi - 8) + q_lo fits int8."""
    if len(terms) == 1:
        (term,) = terms
        values, scale, zero = term.q.astype(np.int16) - 8, term.scale, term.zero
    else:
        low, high = sorted(terms, key=lambda t: float(np.abs(t.scale).sum()))
        if len(terms) != 2 or not np.array_equal(high.scale, 16 * low.scale):
            raise ValueError("an output layer of more than a high and a low term")
        values = 16 * (high.q.astype(np.int16) - 8) + low.q
        scale, zero = low.scale, high.zero + low.zero - 8 * low.scale
    padded = terms[0].padded
    if padded:  # drop the padding: the values of each group's first half
        rows = values.shape[0]
        values = values.reshape(rows, -1, GROUP)[:, :, : GROUP // 2].reshape(rows, -1)
    zeros = None if not np.any(zero) else torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32))
    return (
        values.astype(np.int8),
        torch.from_numpy(np.ascontiguousarray(scale)),
        zeros,
        GROUP // 2 if padded else GROUP,
    )


def ranked_terms(terms: list[Int4Term]) -> list[Int4Term]:
    """The same sum as ``terms``, with the first term alone as close to it as one term can be:
    each later term's group means move into the first term's zeros (the closest constants to
    add, in squares). One term is returned as it is."""
    first, rest = terms[0], terms[1:]
    zero, centred = first.zero.astype(np.float32), []
    for term in rest:
        out_features, in_features = term.q.shape
        mean_q = term.q.reshape(out_features, in_features // GROUP, GROUP).mean(-1, dtype=np.float32)
        mean = (mean_q - 8) * term.scale + term.zero  # each group's mean value
        zero = zero + mean
        centred.append(Int4Term(term.q, term.scale, term.zero - mean))
    return [Int4Term(first.q, first.scale, zero), *centred]


def linear_for(tensor: QuantTensor) -> torch.nn.Module:
    """The fast layer for a weight: 4-bit terms where it has them and the kernel takes its shape."""
    if tensor.terms is not None and tensor.shape[0] % INT4_N_MULTIPLE == 0:
        return Int4Linear(tensor.terms)
    return DenseLinear(torch.from_numpy(np.ascontiguousarray(tensor.dense())))


def concat_rows(tensors: list[QuantTensor]) -> QuantTensor:
    """One weight whose output rows are those of ``tensors`` in order (q/k/v, gate/up): one
    product instead of several. Exact; the result is dense unless every part has the same terms."""
    kinds = {t.kind for t in tensors}
    shape = (sum(t.shape[0] for t in tensors), tensors[0].shape[1])
    if all(t.terms is not None for t in tensors) and len(kinds) == 1:
        terms = [
            Int4Term(
                np.concatenate([t.terms[i].q for t in tensors]),
                np.concatenate([t.terms[i].scale for t in tensors]),
                np.concatenate([t.terms[i].zero for t in tensors]),
            )
            for i in range(len(tensors[0].terms))
        ]
        return QuantTensor(shape, kinds.pop(), terms=terms)
    return QuantTensor(shape, "+".join(sorted(kinds)), values=np.concatenate([t.dense() for t in tensors]))


class SmallLinear(torch.nn.Module):
    """A small layer (a draft head's) on 4-bit terms: ``bits`` 4 quantizes its fp32 weight as
    Q4_1, one term (a quarter of bf16's bytes), 8 as Q8_0, two terms (half). Any leading
    dimensions, an optional bias, bf16 out. Not batch-invariant, and need not be: a draft head
    only proposes what the target verifies."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int) -> None:
        super().__init__()
        tensor = quantize_dense(weight.detach().float().numpy(), bits)
        assert tensor.terms is not None
        self.inner = Int4Linear(tensor.terms)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.out_features, self.in_features = weight.shape

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """Whether the kernel takes this shape (output rows in 16s, inputs in whole groups)."""
        out_features, in_features = weight.shape
        return out_features % INT4_N_MULTIPLE == 0 and in_features % GROUP == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x.reshape(-1, self.in_features))
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def nbytes(self) -> int:
        return self.inner.nbytes() + (self.bias.nbytes if self.bias is not None else 0)


def quantize_linears(model: torch.nn.Module, bits: int) -> int:
    """Replace every ``nn.Linear`` of ``model`` whose shape the kernel takes by a ``SmallLinear``
    of ``bits``, in place; how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and SmallLinear.fits(child.weight):
                setattr(parent, name, SmallLinear(child.weight, child.bias, bits))
                replaced += 1
    return replaced
