"""A draft/target pair on a GPU, at controlled acceptance: what speculative decoding buys there.

Qwen2.5-Coder's 7B and 0.5B cannot be downloaded here, and timing does not depend on the weights'
values, so both are built on the device with random values in their published shapes
(``benchmarks/replicas.py``'s ``SHAPES``) and llama.cpp's Q4_K_M layout: 4-bit groups of 32 where
Q4_K_M has Q4_K (the file's own blocks would be these), dense bf16 where it has Q6_K (``ffn_down``
and ``attn_v`` in the layers ``use_more_bits`` picks, the output layer), embeddings on the host.
Acceptance does depend on the weights, so it is set: ``ControlledDrafter`` runs the real draft
model for every token it proposes (its real cost), then proposes the target's own next token with
probability ``a`` and another token otherwise. Reported, per acceptance:

- tokens per second of plain greedy decoding and of the pair, end to end through the engine (its
  own choice of draft length), and their ratio;
- the analytic optimum for the measured draft cost ``c`` (one draft step in target steps):
  max over k of (1 - a^(k+1)) / ((1 - a)(1 + k c)), a verify pass costing one step (the graphed
  forward's passes of up to 16 rows cost one replay);
- step times of the target in bf16 and in 4-bit, of the draft, and ``torch.cuda.max_memory_allocated``
  for the 4-bit target and the draft with their caches (the context each holds).

    python -m benchmarks.gpu_pair --out benchmarks/results/gpu_pair.json   # on a CUDA GPU
    python -m benchmarks.gpu_pair --target qwen2.5-coder-tiny --draft qwen2.5-coder-tiny --device cpu
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch

from benchmarks.replicas import SHAPES, Shape
from speculative_complete.decoding.drafter_interface import Draft
from speculative_complete.decoding.drafters.model import ModelDrafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.graphed import DRAFT_WIDTHS, WIDTH, GraphedForward
from speculative_complete.decoding.forward.graphed_weights import (
    DenseProduct,
    GraphedLayer,
    GraphedWeights,
    Int4Product,
    Product,
)
from speculative_complete.decoding.forward.shapes import LlamaShape
from speculative_complete.decoding.models.loading import LoadedModel

log = logging.getLogger("gpu_pair")
HOST_ROWS = 4096  # distinct embedding rows kept on the host (ids wrap): values do not matter here


def llama_shape(shape: Shape, context: int) -> LlamaShape:
    return LlamaShape(
        layers=shape.layers,
        dim=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        ffn=shape.ffn,
        vocab=shape.vocab,
        rope_theta=shape.rope_theta,
        norm_eps=shape.rms_eps,
        max_context=context,
    )


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers whose ``ffn_down`` and ``attn_v`` Q4_K_M keeps
    in Q6_K."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


class RandomWeights:
    """Random products on one device: 4-bit groups of 32 or dense in ``dtype``."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def dense(self, rows: int, cols: int) -> Product:
        weight = torch.randn(rows, cols, device=self.device, dtype=self.dtype, generator=self.generator)
        return DenseProduct(weight.mul_(0.02))

    def int4(self, rows: int, cols: int) -> Product:
        q = torch.randint(
            0, 16, (rows, cols), device=self.device, dtype=torch.uint8, generator=self.generator
        )
        groups = cols // 32
        scale = torch.full((rows, groups), 0.004, device=self.device)
        return Int4Product(q, scale, torch.zeros_like(scale))

    def product(self, rows: int, cols: int, four_bit: bool) -> Product:
        return self.int4(rows, cols) if four_bit else self.dense(rows, cols)

    def vector(self, size: int) -> torch.Tensor:
        return torch.ones(size, device=self.device, dtype=self.dtype)


def random_weights(s: LlamaShape, device: torch.device, dtype: torch.dtype, four_bit: bool) -> GraphedWeights:
    """A Qwen2-shaped model of random values in Q4_K_M's layout (``four_bit``) or all dense."""
    make = RandomWeights(device, dtype, seed=s.layers * 1000 + s.dim)
    qkv_rows = (s.heads + 2 * s.kv_heads) * s.head_dim
    layers = []
    for i in range(s.layers):
        six_bit = more_bits(i, s.layers)
        layers.append(
            GraphedLayer(
                attn_norm=make.vector(s.dim),
                qkv=make.product(qkv_rows, s.dim, four_bit and not six_bit),
                out=make.product(s.dim, s.attention_dim, four_bit),
                ffn_norm=make.vector(s.dim),
                gate_up=make.product(2 * s.ffn, s.dim, four_bit),
                down=make.product(s.dim, s.ffn, four_bit and not six_bit),
                qkv_bias=torch.zeros(qkv_rows, device=device, dtype=dtype),
            )
        )
    output = make.dense(s.vocab, s.dim)
    host = torch.randn(HOST_ROWS, s.dim, generator=torch.Generator().manual_seed(s.dim))

    def rows(ids: torch.Tensor) -> torch.Tensor:
        return host[ids.cpu() % HOST_ROWS]

    kind = "random Q4_K_M layout" if four_bit else "random dense"
    return GraphedWeights(layers, make.vector(s.dim), output, rows, rows, kind, kind)


class StandInTokenizer:
    """Random weights have no text: each id decodes to one character, nothing stops early."""

    eos_token_id = None
    bos_token_id = None
    added_tokens_decoder: ClassVar[dict] = {}

    def get_vocab(self) -> dict[str, int]:
        return {}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "x" * len(ids)


def loaded(forward: GraphedForward, name: str) -> LoadedModel:
    config = SimpleNamespace(eos_token_id=None, max_position_embeddings=forward.capacity)
    return LoadedModel.on_lean(
        forward, StandInTokenizer(), config, forward.device, forward.dtype, name, forward.formats
    )


class ControlledDrafter(ModelDrafter):
    """The real draft model's steps, with the target's own next token proposed at probability
    ``acceptance`` (``reference``: the target's plain greedy continuation of ``prompt``)."""

    name = "controlled"

    def __init__(
        self,
        engine: SpeculativeEngine,
        draft: LoadedModel,
        prompt: list[int],
        reference: list[int],
        acceptance: float,
    ) -> None:
        super().__init__(draft, max_draft=WIDTH - 1, cost=engine.cost, target_vocab=engine.target.vocab_size)
        self.prompt_length, self.reference, self.acceptance = len(prompt), reference, acceptance
        self.rng = random.Random(int(acceptance * 1000))
        self.lengths: list[int] = []

    def propose_exactly(self, tokens: Sequence[int], k: int) -> Draft:
        real = super().propose_exactly(tokens, k)
        done = len(tokens) - self.prompt_length
        proposed = []
        for i in range(len(real.tokens)):
            index = done + i
            right = self.reference[index] if index < len(self.reference) else 0
            proposed.append(right if self.rng.random() < self.acceptance else (right + 1) % self.target_vocab)
        self.lengths.append(len(proposed))
        return Draft(tokens=proposed, source=self.name)


def analytic_speedup(acceptance: float, cost: float, most: int = WIDTH - 1) -> tuple[float, int]:
    """max over k of (1 - a^(k+1)) / ((1 - a)(1 + k c)), and the k that reaches it."""
    best = max(
        ((1 - acceptance ** (k + 1)) / ((1 - acceptance) * (1 + k * cost)), k) for k in range(0, most + 1)
    )
    return round(best[0], 3), best[1]


def step_ms(forward: GraphedForward, rounds: int, sync: Any) -> dict[str, float]:
    """Median ms of a one-token step and of a full-width pass, after a 256-token prompt."""
    cache = forward.new_cache()
    forward(list(range(256)), cache)
    timings: dict[str, list[float]] = {"step": [], "verify": []}
    for i in range(rounds):
        for name, count in (("step", 1), ("verify", WIDTH)):
            sync()
            began = time.perf_counter()
            forward([7] * count, cache)
            sync()
            timings[name].append((time.perf_counter() - began) * 1000)
            cache.crop(256 + i)
        forward([5], cache)
    return {name: round(sorted(values)[len(values) // 2], 3) for name, values in timings.items()}


def end_to_end(
    target: LoadedModel, draft: LoadedModel, tokens: int, acceptances: list[float], cost: float, seed: int
) -> list[dict]:
    """Plain greedy, then the controlled pair at each acceptance, on one random prompt."""
    engine = SpeculativeEngine(target)
    prompt = [random.Random(seed).randrange(1000) for _ in range(256)]
    config = GenerationConfig(max_new_tokens=tokens, reuse_continuation=False, prefill_ms=None)
    engine.generate(prompt, config)  # warm: the engine's cost model and the graphs' first replay
    plain = engine.generate(prompt, config)
    reference = plain.token_ids
    plain_ms = plain.stats.decode_ms / max(1, len(reference) - 1)
    rows = []
    for acceptance in acceptances:
        drafter = ControlledDrafter(engine, draft, prompt, reference, acceptance)
        engine.generate(prompt, config, drafter)  # warm: the drafter learns its acceptance
        result = engine.generate(prompt, config, drafter)
        assert result.token_ids == reference, "the pair changed the target's greedy output"
        ms = result.stats.decode_ms / max(1, len(result.token_ids) - 1)
        optimum, best_k = analytic_speedup(acceptance, cost)
        rows.append(
            {
                "acceptance": acceptance,
                "plain_ms_per_token": round(plain_ms, 3),
                "pair_ms_per_token": round(ms, 3),
                "speedup": round(plain_ms / ms, 3),
                "analytic_optimum": optimum,
                "optimum_k": best_k,
                "of_optimum": round(plain_ms / ms / optimum, 3),
                "mean_draft_length": round(sum(drafter.lengths) / max(1, len(drafter.lengths)), 2),
                "tokens_per_pass": round(result.stats.tokens_per_pass, 3),
            }
        )
        log.info("acceptance %.1f: %s", acceptance, rows[-1])
    return rows


def build(
    shape: Shape, device: torch.device, four_bit: bool, context: int, widths: Sequence[int]
) -> GraphedForward:
    s = llama_shape(shape, context + 2 * WIDTH)
    weights = random_weights(s, device, torch.bfloat16, four_bit)
    return GraphedForward(s, weights, device, torch.bfloat16, widths=widths, capacity=context + WIDTH)


def default_model_steps(device: torch.device, rounds: int, sync: Any) -> dict[str, dict[str, float]]:
    """The embedded default model as the server loads it on this device (its Q4_1 blocks on the
    4-bit kernel) against all of it dense in bf16 (the forward before 4-bit weights on CUDA)."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.forward.graphed import from_gguf_on_device
    from speculative_complete.decoding.models.loading import default_gguf_path

    path = str(default_gguf_path())
    blocks = from_gguf_on_device(path, device, torch.bfloat16)
    dense = GraphedForward.from_lean(from_gguf(path, dense=True), device, torch.bfloat16)
    out = {"int4_blocks": step_ms(blocks, rounds, sync), "dense_bf16": step_ms(dense, rounds, sync)}
    out["weights_mb"] = {
        "int4_blocks": round(blocks.nbytes() / 2**20),
        "dense_bf16": round(dense.nbytes() / 2**20),
    }
    log.info("default model: %s", out)
    return out


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    out: dict[str, Any] = {"target": args.target, "draft": args.draft, "context": args.context}
    out["device"] = torch.cuda.get_device_name(device) if cuda else "cpu"
    if args.default_model:
        out["default_model_ms"] = default_model_steps(device, args.rounds, sync)
    if not args.skip_bf16:
        dense = build(SHAPES[args.target], device, four_bit=False, context=args.context, widths=(WIDTH,))
        out["target_bf16_ms"] = step_ms(dense, args.rounds, sync)
        out["target_bf16_weights_mb"] = round(dense.nbytes() / 2**20)
        log.info("bf16 target: %s", out["target_bf16_ms"])
        del dense
        gc.collect()
    before = 0
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)  # anything the bf16 target left behind
    target = build(SHAPES[args.target], device, four_bit=True, context=args.context, widths=(WIDTH,))
    draft = build(SHAPES[args.draft], device, four_bit=True, context=args.context, widths=DRAFT_WIDTHS)
    out["target_int4_ms"] = step_ms(target, args.rounds, sync)
    out["draft_ms"] = step_ms(draft, args.rounds, sync)
    out["target_int4_weights_mb"] = round(target.nbytes() / 2**20)
    out["draft_weights_mb"] = round(draft.nbytes() / 2**20)
    if "target_bf16_ms" in out:
        out["int4_over_bf16_step"] = round(out["target_int4_ms"]["step"] / out["target_bf16_ms"]["step"], 3)
    cost = out["draft_ms"]["step"] / out["target_int4_ms"]["step"]
    out["draft_cost_c"] = round(cost, 3)
    log.info("int4 target %s, draft %s, c %.3f", out["target_int4_ms"], out["draft_ms"], cost)
    out["pair"] = end_to_end(
        loaded(target, args.target), loaded(draft, args.draft), args.tokens, args.acceptance, cost, args.seed
    )
    if cuda:
        out["max_memory_allocated_mb"] = round((torch.cuda.max_memory_allocated(device) - before) / 2**20)
        out["left_before_mb"] = round(before / 2**20)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-7b", choices=sorted(SHAPES))
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--context", type=int, default=4096, help="positions each cache holds")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    parser.add_argument("--rounds", type=int, default=30, help="timed passes per step figure")
    parser.add_argument(
        "--acceptance", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 0.7, 0.9]
    )
    parser.add_argument("--skip-bf16", action="store_true", help="no dense bf16 target (its memory)")
    parser.add_argument("--default-model", action="store_true", help="also the default model's steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    out = run(args)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
