"""Giving freed heap memory back to the operating system.

Why: glibc keeps what a process frees in its heap, and raises the size below which it allocates
from the heap (up to 32 MB) as large blocks are freed, so a pass over many rows leaves its
activations (tens of MB a tensor for a 1.5B model's 512-row prefill) resident until something
trims the heap: the server's resident memory then holds its largest pass long after it. Trimming
takes ~10 ms after such a pass (against seconds for the pass) and about 1 ms otherwise; a
lower fixed threshold would give the memory back too, but made every large pass page-fault its
fresh buffers (a 512-row prefill 20% slower). The server's decode worker trims too whenever no
request waits: the few-row passes of a decode leave tens of MB for it to give back.
No library does this; a no-op off glibc.

Buffers that are mostly headroom (a KV cache grows by a quarter at a time) come zeroed from an
anonymous private mapping (``untouched_zeros``): the kernel gives a page only when it is first
written, where ``torch.zeros`` writes, and so makes resident, every page at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import mmap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TRIM_ROWS = 64  # a pass over this many rows or more trims the heap after it


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Return the free memory at the heap's top and in its free pages to the OS (every thread's
    arena)."""
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):
            libc.malloc_trim(0)


def give_back_freed_memory() -> None:
    """``trim_heap`` after a full collection: unpacking weights at load leaves arrays in reference
    cycles (hundreds of MB for a Qwen 0.5B on torch's kernel) that only a full collection frees.
    Call it again after other load-time work."""
    gc.collect()
    trim_heap()


def untouched_zeros(*size: int) -> torch.Tensor:
    """fp32 zeros of ``size`` whose pages become resident only once written (reading an unwritten
    page maps the kernel's shared zero page). Private and anonymous: a shared mapping would
    allocate on reads too, and numpy's ``zeros`` asks for huge pages, resident 2 MB at a time.
    Freed (unmapped) with the last tensor viewing it. (torch is imported here: the server imports
    this module before it knows whether a model runs in this process.)"""
    import torch

    count = math.prod(size)
    if count == 0:
        return torch.zeros(size)
    mapping = mmap.mmap(-1, count * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=torch.float32).view(size)


__all__ = ["TRIM_ROWS", "give_back_freed_memory", "trim_heap", "untouched_zeros"]
