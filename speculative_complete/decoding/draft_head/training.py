"""``python -m speculative_complete.decoding.draft_head.training``: train a draft head for a target model.

1. **Corpus**: the Python standard library's sources by default, split by file: a file is held out
   (``held_out``) when a hash of its path falls in the last tenth, and the project's benchmarks
   measure only held-out files. ``--corpus DIR`` trains on another folder of source files.
2. **Features**: the target's hidden states over sequences of ``--sequence`` tokens, computed with
   the target's own forward (the quantized one the server runs) and cached on disk in shards, so
   an interrupted run resumes where it stopped and a run over more tokens computes only the new ones.
   On a GPU (``--device cuda``) each batch's states are computed as it is drawn instead
   (``speculative_complete/decoding/draft_head/features.py`` says why and what that changes).
3. **Training**: the head reads f_j and token j+1 and regresses f_{j+1} (smooth L1) while its
   scores over the head's vocabulary match the target's own distribution there (cross-entropy
   against the softmax of the target's output layer on f_{j+1}); ``--depth`` chained passes train
   it on its own estimates as inputs, as drafting uses it (``chain_mask``). A checkpoint after
   every epoch; a rerun resumes from the last one; ``--init`` starts a new run from a trained
   head (the shipped one: ``shipped``). Under bf16 autocast where this CPU is faster in bf16.
4. **Calibration and report**: the temperature that makes the head's probability for its draft
   track how often the target agrees (``fit_confidence_temperature``, one number fitted on the
   held-out files, saved in the head's config); agreement with the target's greedy choice per
   draft position on held-out files, and the tokens per target pass it implies. ``--epochs 0``
   with ``--init`` only calibrates and reports a trained head.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from speculative_complete.decoding.draft_head.features import (
    BatchFeatures,
    CachedFeatures,
    FeatureSource,
    shard_batches,
    shard_sequences,
)
from speculative_complete.decoding.draft_head.network import (
    DraftHead,
    HeadCache,
    HeadConfig,
    chain_mask,
    expected_tokens_per_pass,
    load_head,
    shipped_head,
)
from speculative_complete.decoding.draft_head.precision import bf16_scores_faster
from speculative_complete.decoding.models.loading import LoadedModel, cache_root, load_model

log = logging.getLogger("speculative_complete.decoding.draft_head.training")

SHARD_SEQUENCES = 32


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def held_out(relative: str) -> bool:
    """Whether a corpus file (its path relative to the corpus root) is held out of training."""
    return hashlib.sha256(relative.replace("\\", "/").encode()).digest()[0] % 10 == 0


def corpus_files(root: Path, *, holdout: bool) -> list[Path]:
    """The corpus's Python files on one side of the split, in a stable order."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if skip.isdisjoint(path.parts) and held_out(relative) == holdout:
            files.append(path)
    return files


# -- the target --------------------------------------------------------------------------------------
@dataclass
class Target:
    """What training reads of the target: its forward, embedding and output rows."""

    model: LoadedModel
    fingerprint: str

    @classmethod
    def load(cls, spec: str, quantization: str = "auto") -> Target:
        model = load_model(spec, device="cpu", quantization=quantization)
        forward = model.forward
        if forward.fingerprint is None:
            raise SystemExit(
                f"{spec}: a draft head needs the lean forward (a Llama-family GGUF or int4/int8)"
            )
        return cls(model, forward.fingerprint)

    def encode(self, text: str) -> list[int]:
        return list(self.model.tokenizer(text, add_special_tokens=False)["input_ids"])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.forward.embed(ids.reshape(-1)).reshape(*ids.shape, -1)

    def hidden(self, tokens: list[int]) -> torch.Tensor:
        cache = self.model.forward.new_cache()
        self.model.forward(tokens, cache, keep=1)
        return cache.hidden[: len(tokens)].clone()

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's own greedy next token after each hidden state (its full output layer)."""
        return torch.cat(
            [
                self.model.forward.output_layer(chunk, greedy_only=True).argmax(-1)
                for chunk in hidden.split(256)
            ]
        )


# -- features ----------------------------------------------------------------------------------------
def token_stream(target: Target, files: list[Path], seed: int) -> Iterator[int]:
    order = list(files)
    random.Random(seed).shuffle(order)
    for path in order:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield from target.encode(text + "\n")


def sequences(target: Target, files: list[Path], length: int, limit: int, seed: int) -> Iterator[list[int]]:
    chunk: list[int] = []
    made = 0
    for token in token_stream(target, files, seed):
        chunk.append(token)
        if len(chunk) == length:
            yield chunk
            chunk, made = [], made + length
            if made >= limit:
                return


def extract(
    target: Target, files: list[Path], folder: Path, length: int, limit: int, seed: int
) -> list[Path]:
    """Shards of (tokens, hidden) under ``folder``; shards already there are kept."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    shards: list[Path] = []
    batch: list[tuple[list[int], torch.Tensor]] = []

    def flush(shard: Path) -> None:
        ids = torch.tensor([t for t, _ in batch], dtype=torch.int32)
        hidden = torch.stack([h for _, h in batch]).half()
        save_file({"tokens": ids, "hidden": hidden}, str(shard.with_suffix(".tmp")))
        shard.with_suffix(".tmp").rename(shard)
        shards.append(shard)
        batch.clear()

    bar = tqdm(total=limit // length, desc=f"features {folder.name}", unit="seq", file=sys.stderr)
    shard = folder / "shard_00000.safetensors"
    for index, tokens in enumerate(sequences(target, files, length, limit, seed)):
        shard = folder / f"shard_{index // SHARD_SEQUENCES:05d}.safetensors"
        if shard.exists():
            if index % SHARD_SEQUENCES == 0:
                shards.append(shard)
        else:
            batch.append((tokens, target.hidden(tokens)))
            if len(batch) == SHARD_SEQUENCES:
                flush(shard)
        bar.update(1)
    if batch:
        flush(shard)
    bar.close()
    return shards


def work_folder(target: Target) -> Path:
    """Where a target's features and default head live in the cache."""
    return cache_root() / "heads" / target.fingerprint.replace(":", "-")


def features(target: Target, root: Path, holdout: bool, tokens: int, sequence: int, seed: int) -> list[Path]:
    """The cached feature shards of ``tokens`` tokens of one side of ``root``'s split (made if
    missing, from the full shards of a run over more or fewer tokens where there is one)."""
    tag = f"{hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]}-{sequence}"
    tag += f"-seed{seed}" if seed else ""  # the seed orders the files: another stream
    stem = f"{'held-out' if holdout else 'train'}-{tag}-"
    folder = work_folder(target) / f"{stem}{tokens}"
    link_shared_shards(folder, stem, -(-tokens // sequence))
    return extract(target, corpus_files(root, holdout=holdout), folder, sequence, tokens, seed)


def link_shared_shards(folder: Path, stem: str, sequences_wanted: int) -> None:
    """Hard-link into ``folder`` the shards its siblings (``stem`` + another token count) hold in
    full. Sequence i is the same in every run over one stream (a run only stops it sooner or
    later), so shard k is too wherever both runs fill it: training on more tokens then computes
    only the new ones (~30 min a million tokens on 2 CPU cores), not all of them again."""
    filled = sequences_wanted // SHARD_SEQUENCES  # shards this run fills: 0 .. filled - 1
    for sibling in folder.parent.glob(f"{stem}*"):
        if sibling == folder or not sibling.name.removeprefix(stem).isdigit():
            continue
        for shard in sibling.glob("shard_*.safetensors"):
            mine = folder / shard.name
            if int(shard.stem.split("_")[1]) >= filled or mine.exists():
                continue
            if shard_sequences(shard) == SHARD_SEQUENCES:
                folder.mkdir(parents=True, exist_ok=True)
                link_or_copy(shard, mine)


def link_or_copy(source: Path, destination: Path) -> None:
    """A hard link (no second copy on disk), or a copy where links are not possible."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination.with_suffix(".tmp"))
        destination.with_suffix(".tmp").rename(destination)


def frequent_tokens(token_tensors: Iterable[torch.Tensor], size: int, vocab: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of the training tokens, ascending ids."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for tokens in token_tensors:
        counts += torch.bincount(tokens.long().reshape(-1), minlength=vocab)
    return torch.topk(counts, min(size, vocab)).indices.sort().values


# -- training ----------------------------------------------------------------------------------------
def chain_outputs(
    head: DraftHead, hidden: torch.Tensor, embeds: torch.Tensor, depth: int, noise: float = 0.0
) -> list[torch.Tensor]:
    """g of ``depth`` chained passes over a batch: pass d's entry j reads pass d-1's g at j-1.

    hidden: (batch, rows + 1, dim) the target's states; embeds: (batch, rows, dim) of tokens 1..;
    each result: (batch, rows, dim), entry j an estimate of hidden[:, j + 1]."""
    rows = embeds.shape[1]
    mask = chain_mask(rows, depth).to(hidden.device)
    positions = torch.arange(rows, device=hidden.device)  # a chained entry takes its own index
    cache = HeadCache()
    features = hidden[:, :-1]
    if noise:
        features = features + noise * torch.randn_like(features)
    outputs = []
    for d in range(depth):
        g = head(features, embeds, positions, mask[d * rows : (d + 1) * rows, : (d + 1) * rows], cache)
        outputs.append(g)
        features = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)
    return outputs


def chain_loss(
    head: DraftHead, hidden, embeds, rows_out: torch.Tensor, depth: int, noise: float, ce_weight: float = 1.0
):
    """Smooth L1 to the next hidden state + ``ce_weight`` x cross-entropy against the target's distribution
    over the head's vocabulary, averaged over the chain's passes (entries with a true start only)."""
    target = hidden[:, 1:]
    with torch.no_grad():
        p = torch.softmax(target @ rows_out.T, dim=-1)
    total = hidden.new_zeros(())
    for d, g in enumerate(chain_outputs(head, hidden, embeds, depth, noise)):
        g, want, pd = g[:, d:], target[:, d:], p[:, d:]
        regression = F.smooth_l1_loss(g, want)
        classification = -(pd * torch.log_softmax(g @ rows_out.T, dim=-1)).sum(-1).mean()
        total = total + regression + ce_weight * classification
    return total / depth


TIMED_STEPS = (5, 25)  # steps timed for ``--max-minutes``, after the first (kernels load then)


def epochs_that_fit(step_s: float, steps_per_epoch: int, minutes: float, done: int, planned: int) -> int:
    """The epochs to run up to: ``planned``, or fewer where they would take more than
    ``minutes`` at ``step_s`` a step; always at least the one under way."""
    fit = int(minutes * 60 / (step_s * steps_per_epoch))
    return max(done + 1, min(planned, done + fit))


def train(head: DraftHead, target: Target, source: FeatureSource, args, folder: Path) -> int:
    """``args.epochs`` epochs over ``source``'s batches on its device, a checkpoint after each;
    the epochs the head has had in all. With ``--max-minutes`` (a lent GPU's few minutes), only
    the epochs that fit, at the speed of the first epoch's steps; the learning rate decays over
    the epochs that run."""
    state = folder / "progress.json"
    progress = json.loads(state.read_text()) if state.exists() else {"epochs": 0, "loss": []}
    done = progress["epochs"]
    device = source.device
    head.to(device)
    rows_out = target.model.forward.output_rows(head.vocab.cpu()).to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = source.steps()
    bf16 = use_bf16(args.precision, head.config.dim, device)
    log.info("training on %s in %s", device, "bf16 autocast" if bf16 else "fp32")
    epochs, epoch, timed_from = args.epochs, done, 0.0
    while epoch < epochs:
        head.train()
        bar = tqdm(
            source.epoch(epoch),
            total=steps_per_epoch,
            desc=f"epoch {epoch + 1}",
            file=sys.stderr,
        )
        losses = []
        for step, (tokens, hidden) in enumerate(bar):
            if epoch == done and step == TIMED_STEPS[0]:
                timed_from = time.perf_counter()
            if args.max_minutes and epoch == done and step == TIMED_STEPS[1]:
                step_s = (time.perf_counter() - timed_from) / (TIMED_STEPS[1] - TIMED_STEPS[0])
                epochs = epochs_that_fit(step_s, steps_per_epoch, args.max_minutes, done, epochs)
                log.info("%.0f ms a step: %d epochs in all", 1000 * step_s, epochs)
            for group in optimizer.param_groups:  # warm up, then cosine to a tenth
                t = (epoch * steps_per_epoch + step) / (epochs * steps_per_epoch)
                group["lr"] = args.lr * min(1.0, t * 50) * (0.55 + 0.45 * math.cos(t * math.pi))
            losses.append(train_step(head, optimizer, target, tokens, hidden, rows_out, args, bf16))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        head.eval()
        head.save(folder, {"target": target.fingerprint})
        progress = {
            "epochs": epoch + 1,
            "loss": [*progress.get("loss", []), sum(losses) / max(1, len(losses))],
        }
        state.write_text(json.dumps(progress))
        epoch += 1
    return epoch


def train_step(head, optimizer, target: Target, tokens, hidden, rows_out, args, bf16: bool) -> float:
    """One optimizer step on a batch (tokens and the target's states over them); its loss."""
    device = hidden.device
    with torch.no_grad():
        embeds = target.embed(tokens[:, 1:].cpu()).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = chain_loss(head, hidden, embeds, rows_out, args.depth, args.noise, args.ce_weight)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
    optimizer.step()
    return loss.item()


def use_bf16(precision: str, dim: int, device: torch.device) -> bool:
    """Whether to train under bf16 autocast: asked for, or (``auto``) on an accelerator, and
    where this CPU multiplies in bf16 faster than in fp32 (on a CPU with bf16 instructions, what
    makes more than a few epochs fit in a session). The weights,
    the optimizer and the report stay fp32."""
    if precision == "auto":
        return device.type != "cpu" or bf16_scores_faster(8192, dim)
    return precision == "bf16"


# -- report ------------------------------------------------------------------------------------------
@torch.no_grad()
def agreement(head: DraftHead, target: Target, shards: list[Path], depth: int) -> list[float]:
    """Per draft position d, how often the head's greedy draft equals the target's greedy token,
    among chains whose earlier drafts all agreed and whose inputs are what drafting would feed."""
    rows_out = target.model.forward.output_rows(head.vocab)
    hits, seen = [0] * depth, [0] * depth
    for tokens, hidden in shard_batches(shards, 8, 0):
        truth = target.greedy(hidden[:, 1:].reshape(-1, hidden.shape[-1])).view(tokens.shape[0], -1)
        fed_ok = truth[:, :-1] == tokens[:, 2:]  # entry j's draft equals the next input token
        outputs = chain_outputs(head, hidden, target.embed(tokens[:, 1:]), depth)
        ok = torch.ones_like(truth, dtype=torch.bool)
        previous = None
        for d, g in enumerate(outputs):
            right = head.vocab[(g @ rows_out.T).argmax(-1)] == truth
            if previous is not None:  # chain (d, j) continues (d-1, j-1)
                ok = torch.zeros_like(ok)
                ok[:, 1:] = previous[:, :-1] & fed_ok
            valid = ok.clone()
            valid[:, :d] = False
            hits[d] += int((right & valid).sum())
            seen[d] += int(valid.sum())
            previous = valid & right
    return [h / max(1, s) for h, s in zip(hits, seen, strict=True)]


TEMPERATURES = [round(0.3 + 0.05 * i, 2) for i in range(27)]  # 0.3 .. 1.6


@torch.no_grad()
def fit_confidence_temperature(head: DraftHead, target: Target, shards: list[Path]) -> float:
    """The temperature under which the head's probability for its first draft best predicts
    whether the target agrees (least log loss of that yes/no over held-out positions, on a grid):
    what ``HeadDrafter`` multiplies into the chance that a chain is kept. Training for the
    target's full distribution leaves the head under-confident in its first choice (right far
    more often than it says; ``benchmarks/head_tree.py``), so without it drafts stop early."""
    rows_out = target.model.forward.output_rows(head.vocab)
    loss = torch.zeros(len(TEMPERATURES))
    for tokens, hidden in shard_batches(shards, 8, 0):
        truth = target.greedy(hidden[:, 1:].reshape(-1, hidden.shape[-1]))
        g = chain_outputs(head, hidden, target.embed(tokens[:, 1:]), 1)[0]
        scores = (g @ rows_out.T).reshape(-1, len(rows_out))
        gap = scores - scores.max(-1, keepdim=True).values  # (positions, vocab) <= 0
        agree = (head.vocab[scores.argmax(-1)] == truth).float()
        for i, t in enumerate(TEMPERATURES):
            p = (1.0 / torch.exp(gap / t).sum(-1)).clamp(1e-6, 1 - 1e-6)
            loss[i] -= (agree * p.log() + (1 - agree) * (1 - p).log()).sum()
    return TEMPERATURES[int(loss.argmin())]


def starting_head(args: argparse.Namespace, target: Target, source: FeatureSource, folder: Path) -> DraftHead:
    """The run's own last checkpoint (resuming), else ``--init``'s weights, else a new head."""
    if (folder / "progress.json").exists():
        log.info("resuming %s", folder)
        return load_head(folder).train()
    if args.init:
        start = shipped_head(target.fingerprint) if args.init == "shipped" else Path(args.init).expanduser()
        if start is None:
            raise SystemExit(f"no head ships for {target.fingerprint}")
        head = load_head(start)
        if head.config.target and head.config.target != target.fingerprint:
            raise SystemExit(f"{start}: a head for another model ({head.config.target})")
        log.info("starting from %s", start)
        return head.train()
    shape = target.model.forward.shape
    config = HeadConfig(
        shape.dim,
        shape.heads,
        shape.kv_heads,
        shape.ffn,
        shape.rope_theta,
        shape.norm_eps,
        True,
        target.fingerprint,
    )
    if not args.vocab:
        return DraftHead(config, torch.arange(shape.vocab))
    vocab = frequent_tokens(source.tokens(), args.vocab, shape.vocab)
    return DraftHead(config, vocab)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m speculative_complete.decoding.draft_head.training", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="default", help="the target (default: the embedded SmolLM2)")
    parser.add_argument(
        "--corpus", type=Path, default=None, help="a folder of Python files (default: the stdlib)"
    )
    parser.add_argument(
        "--quantization",
        default="auto",
        help="as the server's setting: a safetensors target needs int4 or int8",
    )
    parser.add_argument("--out", type=Path, default=None, help="the head's folder (default: in the cache)")
    parser.add_argument("--tokens", type=int, default=600_000, help="training tokens")
    parser.add_argument("--held-out-tokens", type=int, default=32_768)
    parser.add_argument("--sequence", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192, help="tokens the head scores (0: all)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--depth", type=int, default=3, help="chained passes in training")
    parser.add_argument("--noise", type=float, default=0.1, help="noise on the target's states in training")
    parser.add_argument(
        "--ce-weight", type=float, default=1.0, help="the cross-entropy's weight beside the regression"
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="bf16: train under bf16 autocast (auto: where this CPU does bf16 faster)",
    )
    parser.add_argument(
        "--init",
        default=None,
        help="start a new run from a head's weights: a folder, or 'shipped' (the target's shipped head)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the head trains (cuda: on a GPU)")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="train only the epochs that fit in this time (timed on the first epoch's steps)",
    )
    parser.add_argument(
        "--features",
        choices=("auto", "cached", "batch"),
        default="auto",
        help="the target's states: cached on disk (auto on the CPU), or computed per batch (auto elsewhere)",
    )
    return parser.parse_args(argv)


def training_source(args: argparse.Namespace, target: Target, root: Path) -> FeatureSource:
    """Where the training batches come from
    (``speculative_complete/decoding/draft_head/features.py``): shards cached on disk for the CPU;
    on an accelerator (or with ``--features batch``) the states of each batch computed as it is
    drawn. No shards where nothing is trained (``--epochs 0``)."""
    on_cpu = torch.device(args.device).type == "cpu"
    mode = args.features if args.features != "auto" else ("cached" if on_cpu else "batch")
    if not args.epochs:
        return CachedFeatures([], args.batch)
    if mode == "cached":
        if not on_cpu:
            raise SystemExit("--features cached trains on the CPU: use --features batch on an accelerator")
        shards = features(target, root, False, args.tokens, args.sequence, args.seed)
        return CachedFeatures(shards, args.batch)
    stream = sequences(target, corpus_files(root, holdout=False), args.sequence, args.tokens, args.seed)
    bar = tqdm(stream, total=args.tokens // args.sequence, desc="tokens", unit="seq", file=sys.stderr)
    ids = torch.tensor(list(bar), dtype=torch.long).reshape(-1, args.sequence)
    return BatchFeatures.load(args.model, args.device, ids, args.batch)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    target = Target.load(args.model, args.quantization)
    root = args.corpus or stdlib_root()
    if args.epochs == 0 and not args.init:
        raise SystemExit("--epochs 0 calibrates a trained head: name it with --init")
    source = training_source(args, target, root)
    test_shards = features(target, root, True, args.held_out_tokens, args.sequence, args.seed)
    folder = args.out or work_folder(target) / "head"
    head = starting_head(args, target, source, folder)
    started = time.perf_counter()
    epochs = train(head, target, source, args, folder) if args.epochs else 0
    head.cpu()  # the report reads the quantized forward's states, on the CPU
    temperature = fit_confidence_temperature(head, target, test_shards)
    head.config = replace(head.config, confidence_temperature=temperature)
    head.save(folder, {"target": target.fingerprint})
    rates = agreement(head, target, test_shards, args.depth)
    report = {
        "target": target.fingerprint,
        "trained_tokens": source.sequences() * args.sequence,
        "epochs": epochs,
        "held_out_agreement": [round(r, 4) for r in rates],
        "expected_tokens_per_pass": round(expected_tokens_per_pass(rates), 3),
        "confidence_temperature": temperature,
        "seconds": round(time.perf_counter() - started, 1),
        "head": str(folder),
    }
    (folder / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
