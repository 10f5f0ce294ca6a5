"""Would a tree of head drafts pay where a chain does? Measured on held-out code.

A chain of m drafted tokens keeps its d-th token with probability a_1 * c_2 * ... * c_d (a_1 the
head's first-position agreement with the target, c_d its agreement at position d given the ones
before agreed). A tree of m nodes may instead verify the head's 2nd or 3rd choice at the first
position beside its first (EAGLE-2's dynamic tree picks the m nodes most likely to be kept). At
most one path is accepted, so the tokens a pass is expected to keep are the sum, over the nodes
sent, of the chance that the node is on it. This measures on held-out standard-library files
(``speculative_complete.decoding.draft_head.training``'s split and feature cache):

- the share of positions where the head's 1st, 2nd and 3rd choice at the first position is the
  target's greedy token;
- the chain's conditional agreement at positions 2..depth (``train_head.agreement``);
- by the head's probability for its first choice (under the head's fitted
  ``confidence_temperature``), how often that choice agrees (the calibration that drafting by
  confidence, ``HeadDrafter._worth``, relies on);

and prints, for m = 1..depth draft rows, the tokens expected to be kept by the chain and by the
best tree of m nodes, where a node under a 2nd or 3rd choice is credited the chain's own
conditional rates (generous to the tree: the head's later guesses after a weaker first one are
no better). ::

    python -m benchmarks.head_tree                      # the shipped head, ~1 min on 2 cores
    python -m benchmarks.head_tree --draft-head FOLDER  # another head for the default model
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

import torch

from speculative_complete.decoding.draft_head.features import shard_batches
from speculative_complete.decoding.draft_head.network import expected_tokens_per_pass, load_head, shipped_head
from speculative_complete.decoding.draft_head.training import (
    Target,
    agreement,
    chain_outputs,
    features,
    stdlib_root,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "head_tree.json"


BINS = 10  # of the head's probability for its first choice, for the calibration table


@torch.no_grad()
def first_choices(head, target: Target, shards: list[Path], top: int = 3) -> tuple[list[float], list[dict]]:
    """How often the head's k-th best token at the first draft position is the target's greedy
    one; and by the head's probability for its first choice (in tenths), the share of positions
    and how often that choice agrees: what drafting by confidence relies on."""
    rows_out = target.model.forward.output_rows(head.vocab)
    hits, seen = [0] * top, 0
    in_bin, agree_in_bin = torch.zeros(BINS), torch.zeros(BINS)
    for tokens, hidden in shard_batches(shards, 8, 0):
        truth = target.greedy(hidden[:, 1:].reshape(-1, hidden.shape[-1])).view(tokens.shape[0], -1)
        g = chain_outputs(head, hidden, target.embed(tokens[:, 1:]), 1)[0]
        scores = g @ rows_out.T / head.config.confidence_temperature  # as HeadDrafter weighs them
        probs, best = torch.softmax(scores, -1).topk(top, -1)
        best = head.vocab[best]
        for k in range(top):
            hits[k] += int((best[..., k] == truth).sum())
        seen += truth.numel()
        bins = (probs[..., 0] * BINS).long().clamp(max=BINS - 1).reshape(-1)
        in_bin += torch.bincount(bins, minlength=BINS).float()
        agree_in_bin += torch.bincount(bins, (best[..., 0] == truth).reshape(-1).float(), minlength=BINS)
    calibration = [
        {
            "probability": f"{b / BINS:.1f}-{(b + 1) / BINS:.1f}",
            "share": round(float(in_bin[b]) / seen, 4),
            "agreement": round(float(agree_in_bin[b] / in_bin[b]), 4) if in_bin[b] else None,
        }
        for b in range(BINS)
    ]
    return [h / seen for h in hits], calibration


def chain_kept(rates: list[float], m: int) -> float:
    """Tokens a chain of ``m`` drafted tokens is expected to keep (rates: a_1, c_2, c_3, ...):
    the tokens per pass it implies, less the target's own token."""
    return expected_tokens_per_pass(rates[:m]) - 1.0


def tree_kept(firsts: list[float], rates: list[float], m: int) -> float:
    """Tokens the best tree of ``m`` nodes is expected to keep: each first-position choice k
    (kept with ``firsts[k]``) heads a chain with the conditional ``rates[1:]``; nodes are taken
    greedily by their chance of being kept, which never grows along a path, so a node's parent
    is always taken before it."""
    frontier = [(-p, 0, k) for k, p in enumerate(firsts)]  # (-chance, depth, branch)
    heapq.heapify(frontier)
    total = 0.0
    for _ in range(m):
        if not frontier:
            break
        chance, depth, branch = heapq.heappop(frontier)
        total -= chance
        if depth + 1 < len(rates):
            heapq.heappush(frontier, (chance * rates[depth + 1], depth + 1, branch))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.head_tree", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--draft-head", default="auto", help="a head's folder (default: the shipped one)")
    parser.add_argument("--tokens", type=int, default=32_768, help="held-out tokens (default 32768)")
    parser.add_argument("--depth", type=int, default=4, help="draft rows to compare up to (default 4)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    target = Target.load("default")
    folder = shipped_head(target.fingerprint) if args.draft_head == "auto" else Path(args.draft_head)
    if folder is None:
        raise SystemExit("no head ships for the default model")
    head = load_head(folder)
    shards = features(target, stdlib_root(), True, args.tokens, 256, 0)
    firsts, calibration = first_choices(head, target, shards)
    rates = agreement(head, target, shards, args.depth)
    rows = [
        {
            "draft_rows": m,
            "chain": round(chain_kept(rates, m), 4),
            "tree": round(tree_kept(firsts, rates, m), 4),
        }
        for m in range(1, args.depth + 1)
    ]
    report = {
        "head": str(folder),
        "first_position_choices": [round(r, 4) for r in firsts],
        "chain_agreement": [round(r, 4) for r in rates],
        "expected_kept": rows,
        "first_choice_calibration": calibration,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
