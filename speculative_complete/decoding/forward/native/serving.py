"""Whether this process multiplies on the native kernels, and which build.

Chosen wherever they are built (``kernels_for_files``), for every file and CPU. A narrow model of
Q4_0/Q4_1/Q8_0 blocks (the default's, 576 wide) once stayed on torch's batched 4-bit kernel on an
AVX-512 CPU, whose passes over several rows beat these products there. Since its greedy choices
are certified (issue 38), each of its passes makes a second product of the output layer's size
(Q8_0's second 4-bit term), and the keystroke replay on an AVX-512 Xeon answered pauses sooner
on these kernels at p50 and p95 (``CHANGELOG.md``, 2026-12-05); a cold prefill of a long
prompt in one pass is what torch's kernel still does faster. ``LSP_NATIVE=1`` or ``0`` forces either;
``LSP_NATIVE_VARIANT=avx2`` loads the AVX2 build; ``LSP_NATIVE_PACK=0`` keeps every weight on the
file's blocks (``kpacked.c`` packs none: what ``benchmarks/models_bench.py`` compares). Loaded once
per process from the cached build.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from speculative_complete.decoding.forward.native.build import built_library
from speculative_complete.decoding.forward.native.library import Kernels

log = logging.getLogger(__name__)


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
            "(python -m speculative_complete.decoding.forward.native --build)",
            variant,
        )
        return None
    # The kernels' threads spin between products; torch's own pool would spin against them on
    # the same cores (a decode step took ten times as long), and what torch still runs of a pass
    # (norms, rotary, small copies) is too small to split anyway.
    torch.set_num_threads(1)
    log.info("native kernels: %s, %d threads (torch's own: 1)", loaded.path, loaded.threads)
    return loaded
