"""Which dtype a draft head computes in on this machine: bf16 on an accelerator, and on a CPU
where bf16 products are measured faster than fp32 ones.

Shared by the drafter that runs a head (``speculative_complete.decoding.drafters.head``) and the
training that fits one (``training.use_bf16``), so both make the same choice from the same
measurement.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch


def head_dtype(dim: int, device: torch.device | None = None) -> torch.dtype:
    """bf16 on an accelerator, and on the CPU where scoring a head's tokens (8192 here, the
    shipped head's) of width ``dim`` is faster in it on this machine; else fp32."""
    if device is not None and device.type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if bf16_scores_faster(8192, dim) else torch.float32


@functools.cache
def bf16_scores_faster(rows: int, dim: int) -> bool:
    """Whether scoring a draft (rows x dim times a vector) is faster in bf16 than in fp32 here.

    Scoring the head's 8192 tokens is most of a draft token's cost, and it is bound by reading
    the rows: on a CPU with bf16 instructions half the bytes take a quarter of the time
    (``benchmarks/README.md``); elsewhere torch emulates bf16 and is slower. No library says
    which, so it is timed once per process and shape (a few ms). bf16 scores only choose and
    weigh drafts: the target verifies them, and a sampled draft's q is the distribution those
    scores make, so exactness does not depend on it.
    """
    generator = torch.Generator().manual_seed(0)
    matrix, vector = torch.randn(rows, dim, generator=generator), torch.randn(dim, generator=generator)
    low, low_vector = matrix.to(torch.bfloat16), vector.to(torch.bfloat16)

    def best_of(product: Callable[[], torch.Tensor]) -> float:
        product()
        times = []
        for _ in range(5):
            started = time.perf_counter()
            product()
            times.append(time.perf_counter() - started)
        return min(times)

    return best_of(lambda: low @ low_vector) < 0.8 * best_of(lambda: matrix @ vector)
