"""Per-pass microbenchmark: what one target pass costs in each weight format, and the memory.

A decode step (one token after ``--context`` tokens), verification passes over 2, 4 and 8
tokens, a prefill of ``--context`` tokens, and the process's resident memory with the model
loaded and warm. Each format runs in a process of its own, so its RSS is its own; the formats
alternate round by round (``--rounds``) so the machine's load hits them alike, and each
figure is the median over all rounds. Speed is reported as a ratio against ``none`` (the GGUF
dequantized to fp32 on transformers' forward, the previous default) measured in the same run.

Formats: ``none`` (fp32, transformers' forward), ``auto`` (the GGUF's own blocks on the lean
forward), ``int8`` / ``int4`` (the dequantized copy quantized again at load on the lean forward).
With ``--device cuda``: ``none`` is transformers' eager forward and ``auto`` the graphed lean
forward (``speculative_complete/decoding/forward/graphed.py``), both in ``--dtype``; GPU memory is
reported too.

    python -m benchmarks.pass_bench [--formats none,auto,int8,int4] [--rounds 3]
    python -m benchmarks.pass_bench --device cuda --dtype bfloat16 --formats none,auto
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from speculative_complete.lsp_server.stats import process_memory

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "pass_bench.json"
VERIFY_WIDTHS = (2, 4, 8)


def _load(fmt: str, device: str = "cpu", dtype: str = "float32"):
    from speculative_complete.decoding.models.loading import (
        CONVERTED_FORMAT_VERSION,
        cache_root,
        default_gguf_path,
        file_sha256,
        load_model,
    )

    if fmt in ("none", "auto"):
        return load_model("default", device=device, dtype=dtype, quantization=fmt)
    copy = cache_root() / f"{file_sha256(default_gguf_path())[:32]}-v{CONVERTED_FORMAT_VERSION}"
    if not copy.is_dir():
        load_model("default", quantization="none")  # writes the dequantized copy once
    return load_model(str(copy), device=device, dtype=dtype, quantization=fmt)


def measure_one(
    fmt: str, context: int, steps: int, device: str = "cpu", dtype: str = "float32"
) -> dict[str, Any]:
    """One format, in this process: load, warm up, time the passes."""
    import torch

    torch.manual_seed(0)
    started = time.perf_counter()
    model = _load(fmt, device, dtype)
    load_s = time.perf_counter() - started
    forward = model.forward
    prompt = torch.randint(0, model.vocab_size, (context,)).tolist()
    on_gpu = model.device.type == "cuda"

    def timed(tokens: list[int], cache: Any, keep: int = 0) -> float:
        t0 = time.perf_counter()
        forward(tokens, cache, keep, greedy_only=True)  # as the server's greedy generations run it
        if on_gpu:  # the pass is queued, not done, when the call returns
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000

    with torch.inference_mode():
        prefill = [timed(prompt, forward.new_cache(), keep=1) for _ in range(2)]
        cache = forward.new_cache()
        forward(prompt, cache, keep=1)
        passes: dict[str, float] = {"prefill": min(prefill)}
        for width in (1, *VERIFY_WIDTHS):
            times = []
            for _ in range(steps + 2):
                times.append(timed(prompt[:width], cache))
                cache.crop(-width)
            passes["step" if width == 1 else f"verify{width}"] = statistics.median(times[2:])
    gpu_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1) if on_gpu else 0.0
    return {
        "format": fmt,
        "quantization": model.quantization,
        "load_s": round(load_s, 2),
        "passes_ms": {k: round(v, 3) for k, v in passes.items()},
        "gpu_peak_mb": gpu_mb,
        **process_memory(),
    }


def run_format(fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.pass_bench",
        "--one",
        fmt,
        "--context",
        str(args.context),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(rounds: list[dict[str, dict[str, Any]]], formats: list[str]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for fmt in formats:
        runs = [r[fmt] for r in rounds]
        passes = {
            k: round(statistics.median(r["passes_ms"][k] for r in runs), 2) for k in runs[0]["passes_ms"]
        }
        summary[fmt] = {
            "quantization": runs[0]["quantization"],
            "passes_ms": passes,
            "rss_mb": statistics.median(r["rss_mb"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
            "load_s": statistics.median(r["load_s"] for r in runs),
            "gpu_peak_mb": statistics.median(r.get("gpu_peak_mb", 0.0) for r in runs),
        }
    base = summary.get("none")
    for entry in summary.values():
        entry["x_none"] = (
            {k: round(base["passes_ms"][k] / v, 2) for k, v in entry["passes_ms"].items()} if base else None
        )
        step = entry["passes_ms"]["step"]
        entry["relative_to_step"] = {k: round(v / step, 2) for k, v in entry["passes_ms"].items()}
    return summary


def format_table(summary: dict[str, dict[str, Any]], context: int) -> str:
    keys = ["step", *(f"verify{w}" for w in VERIFY_WIDTHS), "prefill"]
    head = (
        f"{'format':<8}{'weights':<18}"
        + "".join(f"{k:>10}" for k in keys)
        + f"{'RSS MB':>9}{'x none (step)':>15}"
    )
    lines = [f"ms per pass at a {context}-token context (median), resident memory with the model warm", head]
    for fmt, s in summary.items():
        x = s["x_none"]["step"] if s["x_none"] else None
        lines.append(
            f"{fmt:<8}{s['quantization'][:17]:<18}"
            + "".join(f"{s['passes_ms'][k]:>10.2f}" for k in keys)
            + f"{s['rss_mb']:>9.0f}{'' if x is None else f'{x:.2f}x':>15}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pass_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--formats", default="none,auto,int8,int4")
    parser.add_argument("--rounds", type=int, default=3, help="processes per format, alternating (default 3)")
    parser.add_argument("--context", type=int, default=512, help="tokens in the cache (default 512)")
    parser.add_argument("--steps", type=int, default=20, help="timed passes per width (default 20)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", help="off the CPU's quantized blocks (default float32)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one format, print JSON
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.context, args.steps, args.device, args.dtype)))
        return 0
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    rounds = []
    for number in range(args.rounds):
        rounds.append({fmt: run_format(fmt, args) for fmt in (formats if number % 2 == 0 else formats[::-1])})
        print(
            f"round {number + 1}/{args.rounds}: "
            + ", ".join(f"{f} step {r['passes_ms']['step']:.1f} ms" for f, r in rounds[-1].items()),
            file=sys.stderr,
        )
    summary = summarize(rounds, formats)
    print(format_table(summary, args.context))
    from benchmarks.decode_bench import write_json

    write_json(
        args.out,
        {
            "config": {
                "formats": formats,
                "rounds": args.rounds,
                "context": args.context,
                "steps": args.steps,
                "cpu_count": os.cpu_count(),
                "device": args.device,
                "dtype": args.dtype,
            },
            "summary": summary,
            "rounds": rounds,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
