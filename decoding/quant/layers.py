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
  for a few rows and batch-invariant (``F.linear`` switches kernels with the row count); one
  row is doubled, because MKL's one-row path sums in another order.
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.quant.gguf_blocks import GROUP, Int4Term, QuantTensor

INT4_N_MULTIPLE = 16  # the kernel packs output rows in groups of 16


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed[0], GROUP, self.scales[0])
        for packed, scales in zip(self.packed[1:], self.scales[1:], strict=True):
            out = out + torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales)
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
        if rows == 1:
            x = x.expand(2, -1)
        return (self.weight @ x.t())[:, :rows].t().contiguous()

    def nbytes(self) -> int:
        return self.weight.nbytes


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
        terms = [Int4Term(np.concatenate([t.terms[i].q for t in tensors]),
                          np.concatenate([t.terms[i].scale for t in tensors]),
                          np.concatenate([t.terms[i].zero for t in tensors]))
                 for i in range(len(tensors[0].terms))]
        return QuantTensor(shape, kinds.pop(), terms=terms)
    return QuantTensor(shape, "+".join(sorted(kinds)), values=np.concatenate([t.dense() for t in tensors]))
