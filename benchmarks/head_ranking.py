"""How often the output layer's candidates hold the fp32 layer's greedy token, on real code.

``QuantizedOutputLayer`` (``speculative_complete/decoding/forward/quant/layers.py``) ranks the
vocabulary with a 4-bit copy of the output layer and recomputes only the ``CANDIDATES`` best in fp32
from the file's exact values (``GREEDY_CANDIDATES`` under ``greedy_only``, where it also recomputes
any token whose error bound could beat them, so its greedy token is always the fp32 layer's). This
runs the default model over held-out standard-library files
(``speculative_complete.decoding.draft_head.training``'s split) and counts, per position, whether
the fp32 layer's greedy token is among the candidates of each ranking:

- ``leading term``: a Q8_0 layer's leading 4-bit term alone, the group means of the rest folded
  in (what greedy generations ranked by until its approximations were found to decide healed
  choices; its error bound is too loose to certify anything);
- ``both terms``: the whole 4-bit product, what the layer ranks by;

how many tokens per position the bound sent to exact recomputation (``repaired_per_position``),
and times one row's ranking product for each, and the whole layer in either mode. ::

    python -m benchmarks.head_ranking            # 32k held-out tokens, ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speculative_complete.decoding.draft_head.training import Target, corpus_files, sequences, stdlib_root
from speculative_complete.decoding.forward.quant.layers import QuantizedOutputLayer

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "head_ranking.json"


def fp32_greedy(head: QuantizedOutputLayer, hidden: torch.Tensor, slice_rows: int = 4096) -> torch.Tensor:
    """The greedy token of the exact fp32 layer, its rows made in slices (the whole is 113 MB)."""
    best = torch.full((hidden.shape[0],), float("-inf"))
    index = torch.zeros(hidden.shape[0], dtype=torch.long)
    for first in range(0, head.out_features, slice_rows):
        ids = torch.arange(first, min(first + slice_rows, head.out_features))
        scores = hidden @ head.rows(ids).t()
        value, where = scores.max(-1)
        better = value > best
        best, index = torch.where(better, value, best), torch.where(better, where + first, index)
    return index


def greedy_head(head: QuantizedOutputLayer, greedy_only: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        return head(x, greedy_only=greedy_only)

    return run


def time_row(layer: Callable[[torch.Tensor], torch.Tensor], dim: int, repeats: int = 50) -> float:
    x = torch.randn(1, dim)
    for _ in range(5):
        layer(x)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        layer(x)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def measure(tokens: int, length: int) -> dict[str, Any]:
    os.environ["LSP_NATIVE"] = "0"  # the layer measured is torch's, whatever this CPU would choose
    target = Target.load("default")
    head = target.model.forward.output_layer
    if not isinstance(head, QuantizedOutputLayer):
        raise SystemExit("the default model's output layer is not on the 4-bit kernel here")
    rankings = {"leading term": head.approx.leading, "both terms": head.approx}
    held = {name: 0 for name in rankings}
    worst = {name: 0 for name in rankings}  # the lowest rank the fp32 greedy token had (0: first)
    greedy_same = positions = repaired = 0
    files = corpus_files(stdlib_root(), holdout=True)
    with torch.inference_mode():
        for chunk in sequences(target, files, length, tokens, seed=0):
            hidden = target.hidden(chunk)
            want = fp32_greedy(head, hidden)
            for name, layer in rankings.items():
                scores = layer(hidden).float()
                rank = (scores > scores.gather(1, want[:, None])).sum(-1)
                held[name] += int((rank < QuantizedOutputLayer.CANDIDATES).sum())
                worst[name] = max(worst[name], int(rank.max()))
            repaired -= head.repaired
            greedy_same += int((head(hidden, greedy_only=True).argmax(-1) == want).sum())
            repaired += head.repaired
            positions += len(chunk)
    return {
        "positions": positions,
        "candidates": QuantizedOutputLayer.CANDIDATES,
        "held_share": {name: round(n / positions, 5) for name, n in held.items()},
        "worst_rank": worst,
        "greedy_only_is_fp32_share": round(greedy_same / positions, 5),
        "repaired_per_position": round(repaired / positions, 5),
        "ranking_ms_per_row": {name: time_row(layer, head.in_features) for name, layer in rankings.items()},
        "layer_ms_per_row": {
            "greedy_only": time_row(greedy_head(head, True), head.in_features),
            "full": time_row(greedy_head(head, False), head.in_features),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.head_ranking", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tokens", type=int, default=32_768, help="held-out tokens (default 32768)")
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = measure(args.tokens, args.length)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    json.dump(result, sys.stdout, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
