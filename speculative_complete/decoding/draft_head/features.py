"""Where ``train_head`` gets the target's hidden states from: cached shards, or a batch at a time.

A training step reads, for a batch of token sequences, the target's hidden states over them
(``speculative_complete/decoding/draft_head/network.py`` defines them). Two sources give the same batches:

- ``CachedFeatures`` (the CPU's): the states computed once with the target's own quantized
  forward, the one the server runs, and kept on disk in shards (``train_head.features``). On 2
  CPU cores they cost ~30 minutes a million tokens, so no run computes them twice.
- ``BatchFeatures`` (an accelerator's): each batch's states computed as it is trained on, by
  transformers' model of the target's dequantized weights in fp32, batched under its causal
  attention. On a GPU that forward should take milliseconds a batch (a 135M model; not yet
  timed there), less than reading a shard, and the whole standard library's training side (~7M
  tokens) would be ~8 GB of shards; computed per batch, a lent GPU's few minutes can train on
  all of it, epoch after epoch. Its states are not bit for bit the quantized forward's, but they
  differ by far less than the noise training adds to them anyway (``--noise``; figures:
  ``benchmarks/README.md``). The held-out
  report still reads the quantized forward's cached states, the ones the server's head will read.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from speculative_complete.decoding.models.loading import load_model

Batch = tuple[torch.Tensor, torch.Tensor]  # tokens (batch, rows) long, hidden (batch, rows, dim) fp32


@dataclass
class CachedFeatures:
    """Batches of cached shards, on the CPU, in an order drawn from the epoch's seed."""

    shards: list[Path]
    batch: int

    device = torch.device("cpu")

    def steps(self) -> int:
        return sum(-(-shard_sequences(shard) // self.batch) for shard in self.shards)

    def sequences(self) -> int:
        return sum(shard_sequences(shard) for shard in self.shards)

    def epoch(self, seed: int) -> Iterator[Batch]:
        return shard_batches(self.shards, self.batch, seed)

    def tokens(self) -> Iterator[torch.Tensor]:
        from safetensors import safe_open

        for shard in self.shards:
            with safe_open(str(shard), framework="pt") as data:  # the states stay on disk
                yield data.get_tensor("tokens")


@dataclass
class BatchFeatures:
    """Batches of ``ids`` whose states ``model`` computes as each is drawn, on its device."""

    model: torch.nn.Module  # a transformers causal LM of the target, in fp32
    ids: torch.Tensor  # (n, rows) token ids, on the CPU
    batch: int

    @classmethod
    def load(cls, spec: str, device: str, ids: torch.Tensor, batch: int) -> BatchFeatures:
        """``spec``'s model through transformers (dequantized where it is a GGUF) on ``device``."""
        if torch.device(device).type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # ~1e-3 relative: far below the ~1% above
        model = load_model(
            spec, device=device, quantization="none", dtype="float32", transformers_forward=True
        ).model
        return cls(model.eval(), ids, batch)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def steps(self) -> int:
        return -(-len(self.ids) // self.batch)

    def sequences(self) -> int:
        return len(self.ids)

    @torch.no_grad()
    def epoch(self, seed: int) -> Iterator[Batch]:
        order = torch.randperm(len(self.ids), generator=torch.Generator().manual_seed(seed))
        for pick in order.split(self.batch):
            tokens = self.ids[pick].to(self.device)
            yield tokens, self.model.base_model(input_ids=tokens).last_hidden_state.float()

    def tokens(self) -> Iterator[torch.Tensor]:
        yield self.ids


def shard_sequences(shard: Path) -> int:
    """Sequences in a shard, read from its header (the tensors stay on disk)."""
    from safetensors import safe_open

    with safe_open(str(shard), framework="pt") as data:
        return int(data.get_slice("tokens").get_shape()[0])


def shard_batches(shards: list[Path], size: int, seed: int) -> Iterator[Batch]:
    from safetensors.torch import load_file

    order = list(shards)
    random.Random(seed).shuffle(order)
    for shard in order:
        data = load_file(str(shard))
        perm = torch.randperm(len(data["tokens"]), generator=torch.Generator().manual_seed(seed))
        for start in range(0, len(perm), size):
            pick = perm[start : start + size]
            yield data["tokens"][pick].long(), data["hidden"][pick].float()


FeatureSource = CachedFeatures | BatchFeatures
