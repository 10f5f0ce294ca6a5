"""Linear layers for the lean forward: 4-bit weight-only on torch's CPU kernel, and dense fp32.

Both give every row the same result whatever the number of rows in the pass (batch
invariance), which is what keeps speculative greedy decoding token for token equal to plain
decoding of the same quantized model: a verification pass over k+1 rows must compute each row
exactly as a one-token step would. ``tests/test_quant.py`` checks it for both layers, 1 to 256
rows.

- ``Int4Linear``: a sum of ``Int4Term``s packed for ``_weight_int4pack_mm_for_cpu``. That kernel
  takes bf16 activations (fp32 and fp16 inputs run a scalar path ~25x slower), accumulates in
  fp32 and returns bf16; its per-row arithmetic does not depend on the row count.
- ``DenseLinear``: fp32 weights computed as ``weight @ x.T``, MKL's path that stays both fast
  for a few rows and batch-invariant (``F.linear`` switches kernels with the row count) from
  ``MIN_DENSE_ROWS`` rows on: fewer rows are padded, because MKL sums a product of few rows in
  another order (below 2 rows on one CPU, below 12 on an AVX-512 one; ``tests/test_quant.py``
  checks the machine it runs on).
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.quant.gguf_blocks import GROUP, Int4Term, QuantTensor, quantize_dense

INT4_N_MULTIPLE = 16  # the kernel packs output rows in groups of 16
MIN_DENSE_ROWS = 16  # fewer rows than this are padded (see DenseLinear)


class Int4Linear(torch.nn.Module):
    """``x @ W.T`` for ``W`` a sum of 4-bit terms; input (rows, in), output (rows, out) bf16."""

    def __init__(self, terms: list[Int4Term]) -> None:
        super().__init__()
        self.out_features, self.in_features = terms[0].q.shape
        packed, scales = [], []
        for term in terms:
            q = torch.from_numpy(term.q.astype(np.int32))
            packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
            pair = np.stack([term.scale.T, term.zero.T], axis=-1)  # (in // GROUP, out, 2)
            scales.append(torch.from_numpy(np.ascontiguousarray(pair)).to(torch.bfloat16))
        self.packed = packed
        self.scales = scales

    def leading(self, x: torch.Tensor) -> torch.Tensor:
        """The first term's product alone."""
        return self._term(x.to(torch.bfloat16), 0)

    def _term(self, x: torch.Tensor, index: int) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed[index], GROUP, self.scales[index])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        out = self._term(x, 0)
        for index in range(1, len(self.packed)):
            out = out + self._term(x, index)
        return out

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.packed, *self.scales))


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
        return (self.weight @ x.t())[:, :rows].t().contiguous()

    def nbytes(self) -> int:
        return self.weight.nbytes


class QuantizedHead(torch.nn.Module):
    """The output layer on 4-bit terms, with exact fp32 logits where they decide anything.

    The output layer is the largest product of a step (49152 x 576 for SmolLM2): dense fp32 it
    streams 113 MB a step, several times what the 4-bit kernel reads. But the kernel returns
    bf16, whose rounding of logits near 20 (steps of 1/8) changes the greedy choice at ~2.5% of
    positions. So the kernel's logits only pick the ``CANDIDATES`` most likely tokens per row,
    and those are recomputed in fp32 from the file's exact values: the greedy choice is then
    the fp32 layer's (measured: the same next-token agreement with the dequantized fp32 model,
    99.2%, as the dense fp32 layer), the other logits stay the kernel's. Every step is per row,
    so the layer stays batch-invariant. The same table serves the input embedding lookup.

    Picking candidates needs only a ranking. A weight of two terms (Q8_0, what GGUF files keep
    the output layer in) is kept as a leading term with each group's mean of the other folded
    into its zero, plus that other term less its means (``ranked_terms``; the same sum). When
    only each row's greedy token matters (``greedy_only``, which the engine sets for greedy
    generations) the leading term alone ranks the tokens: half the bytes a step reads (0.39
    against 0.99 ms here), and the logits outside the candidates are then 4-bit approximations.
    They decide nothing greedy, and sampling never sees them: it gets both terms, as before.
    ``benchmarks/head_ranking.py`` measures how often the fp32 layer's greedy token is among
    the leading term's candidates on real code (every time in 32k positions; at worst 36th).
    """

    CANDIDATES = 128  # the fp32 greedy token ranked at worst 36th on 32k held-out positions

    def __init__(self, tensor: QuantTensor) -> None:
        super().__init__()
        assert tensor.terms is not None
        self.approx = Int4Linear(ranked_terms(tensor.terms))
        self.greedy_only = False
        self.out_features, self.in_features = tensor.shape
        if len(tensor.terms) == 2:  # Q8_0 split as 16 * (hi - 8) + lo: the int8 values again
            hi, lo = tensor.terms
            values = (16 * (hi.q.astype(np.int16) - 8) + lo.q).astype(np.int8)
            self.values, self.offset = torch.from_numpy(values), 0
            self.scale, self.zero = torch.from_numpy(lo.scale), None
        else:
            (term,) = tensor.terms
            self.values, self.offset = torch.from_numpy(term.q), 8
            self.scale, self.zero = torch.from_numpy(term.scale), torch.from_numpy(term.zero)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The exact fp32 weights of rows ``index`` (any shape), shape ``(*index.shape, in)``."""
        values = self.values[index].float()
        if self.offset:
            values -= self.offset
        grouped = values.view(*index.shape, -1, GROUP) * self.scale[index].unsqueeze(-1)
        if self.zero is not None:
            grouped += self.zero[index].unsqueeze(-1)
        return grouped.view(*index.shape, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = (self.approx.leading(x) if self.greedy_only else self.approx(x)).float()
        top = logits.topk(min(self.CANDIDATES, self.out_features), dim=-1).indices  # (rows, CANDIDATES)
        exact = (self.rows(top) * x.float().unsqueeze(1)).sum(-1)
        return logits.scatter_(1, top, exact)

    def nbytes(self) -> int:
        extra = self.zero.nbytes if self.zero is not None else 0
        return self.approx.nbytes() + self.values.nbytes + self.scale.nbytes + extra


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
