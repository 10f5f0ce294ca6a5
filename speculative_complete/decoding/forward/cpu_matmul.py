"""Linear layers that multiply one or a few rows faster on the CPU.

Decoding feeds the target one token per pass, and speculative verification 2-9; there PyTorch's
``linear`` (MKL's sgemm with the weight transposed, or its gemv for a single row) is far from what
the memory bandwidth allows. The same product computed as ``weight @ x.T`` takes another MKL path,
several times faster for a few rows (``benchmarks/README.md``, "Measurements behind design
choices", has the figures for SmolLM2-135M in fp32):

- 2-9 rows: ``weight @ x.T``; passes over 2-5 tokens then cost little more than one token's.
- 1 row: no faster as ``weight @ x.T``, but two copies of it are, for layers wider than they
  are tall, so a single row is doubled there.
- Long passes (prefill) are faster with ``linear``, and are left to it.

No library makes this choice (it is a property of one BLAS on one kind of CPU), so it is a few
lines here, applied only to fp32 models on the CPU. The results agree with ``linear`` to float
rounding (~1e-5 on the logits), as any two GEMM kernels do; greedy exactness is checked against
the same model's plain decoding, which uses these layers too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SMALL_BATCH = range(2, 10)  # rows where weight @ x.T measured faster than linear (fp32, 2-core CPU)


class SmallBatchLinear(torch.nn.Linear):
    """``nn.Linear`` with the faster product for 1-9 rows; the parameters are the original ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        flat = x.reshape(rows, x.shape[-1]) if rows else x
        if rows == 1 and self.out_features > self.in_features:
            flat = flat.expand(2, -1).contiguous()
        elif rows not in SMALL_BATCH:
            return F.linear(x, self.weight, self.bias)
        out = (self.weight @ flat.t())[:, :rows].t().contiguous()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def use_small_batch_linear(model: torch.nn.Module) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` to ``SmallBatchLinear`` in place (the class
    only: weights, ties and devices stay as they are); how many were switched."""
    switched = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = SmallBatchLinear
            switched += 1
    return switched
