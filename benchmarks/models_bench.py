"""Speed and memory on real GGUF files, ours against llama.cpp's server on the same file.

For each model file: our lean forward on each kernel backend (``native``: llama.cpp's kernels
through ``speculative_complete/decoding/forward/native``, Q4_K, Q6_K (and on AVX-512 Q5_0) rows
packed at load; ``blocks``: the same kernels on the file's own blocks, ``LSP_NATIVE_PACK=0``;
``torch``: torch's 4-bit kernel, ``LSP_NATIVE=0``), each in a process of its own (load time,
resident memory with the model warm and the freed heap given back as the server's worker does
between requests, a decode step and verify passes over 2, 4 and 8 tokens after ``--context``
tokens, taken in turn, and 8 tokens' pass in steps; a prefill of ``--context`` tokens), and
llama-server (2 threads, the same file) on the same random prompt: its load time, resident
memory, prefill and decode per token from its own ``timings``, and its passes over 2, 4 and 8 new
tokens after that prompt (``peer_batches``). The file is read through once first, so that every
load finds it in the page cache; backends and the peer take turns in an order reversed round by
round; each figure is the median over rounds.

``--isa avx2`` runs our processes on AVX2 code only (torch's ``ATEN_CPU_CAPABILITY``, MKL's
``MKL_ENABLE_INSTRUCTIONS`` and the native kernels' AVX2 build), to measure an AVX-512 machine
as the laptops most people have; the peer then runs the llama-server built for AVX2
(``python -m benchmarks.llama_server --build --variant avx2``; ``LLAMA_SERVER_BIN`` may name
one), else it is skipped. Models: ``default``, any GGUF path, or
a shape-true replica (``benchmarks/replicas.py``, e.g. ``qwen2.5-coder-0.5b:Q4_K_M``)::

    python -m benchmarks.models_bench [--models default,qwen2.5-coder-0.5b:Q4_K_M] [--isa avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.llama_server import LlamaServer

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "models_bench.json"
WIDTHS = (1, 2, 4, 8)
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "LSP_NATIVE_VARIANT": "avx2"}


def model_path(spec: str) -> Path:
    if spec == "default":
        from speculative_complete.decoding.models.loading import default_gguf_path

        return default_gguf_path()
    if ":" in spec and not Path(spec).exists():
        from benchmarks.replicas import replica

        name, qtype = spec.split(":", 1)
        return replica(name, qtype)
    return Path(spec)


def measure_ours(path: str, context: int, steps: int) -> dict[str, Any]:
    """One backend (the environment's), in this process."""
    import torch

    from speculative_complete.decoding.memory import trim_heap
    from speculative_complete.decoding.models.loading import load_model
    from speculative_complete.lsp_server.stats import process_memory

    started = time.perf_counter()
    model = load_model(path, device="cpu", dtype="float32")
    load_s = time.perf_counter() - started
    forward = model.forward
    prompt = torch.randint(
        0, model.vocab_size, (context,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    with torch.inference_mode():
        started = time.perf_counter()
        cache = forward.new_cache()
        forward(prompt, cache, keep=1, greedy_only=True)
        passes = {"prefill_ms_per_token": (time.perf_counter() - started) * 1000 / context}
        # The widths in turn, so that a shared machine's slower minutes fall on all of them alike
        # and the ratios between them (8 rows against a step) hold.
        times: dict[int, list[float]] = {width: [] for width in WIDTHS}
        for _ in range(steps + 2):
            for width in WIDTHS:
                t0 = time.perf_counter()
                forward(prompt[:width], cache, greedy_only=True)
                times[width].append((time.perf_counter() - t0) * 1000)
                cache.crop(-width)
        for width, taken in times.items():
            passes["step_ms" if width == 1 else f"verify{width}_ms"] = statistics.median(taken[2:])
        passes["verify8_steps"] = passes["verify8_ms"] / passes["step_ms"]
    kernels = "native" if forward.native is not None else "torch"
    # what the server's decode worker does once no request waits (speculative_complete/lsp_server/server.py)
    trim_heap()
    return {
        "load_s": load_s,
        "quantization": model.quantization,
        "kernels": kernels,
        **passes,
        **process_memory(),
    }


def run_ours(path: Path, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LSP_NATIVE": "0" if backend == "torch" else "1"}
    if backend == "blocks":  # the native kernels on the file's own blocks, no weight packed
        env["LSP_NATIVE_PACK"] = "0"
    if args.isa == "avx2":
        env.update(AVX2_ENV)
    cmd = [sys.executable, "-m", "benchmarks.models_bench", "--one", str(path)]
    cmd += ["--context", str(args.context), "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    served = "torch" if backend == "torch" else "native"
    if result["kernels"] != served:  # a variant not built for these sources: torch's served instead
        variant = env.get("LSP_NATIVE_VARIANT", "native")
        raise SystemExit(
            f"{path.name}: the {variant} native kernels did not load; build them first "
            f"(python -m speculative_complete.decoding.forward.native --build --variant {variant})"
        )
    return result


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` POSTed to a llama-server endpoint; its JSON answer."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def read_through(path: Path) -> None:
    """Reads the whole file once: the first load timed would else read it from disk and the
    others from the page cache."""
    with path.open("rb") as file:
        while file.read(1 << 24):
            pass


def run_peer(path: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """llama-server on the same file: load, then one prompt of ``context`` random tokens with 32
    tokens to decode (its own timings), then batches after that prompt (``peer_batches``)."""
    from benchmarks.llama_server import LlamaServer, LlamaServerError, llama_server_binary
    from speculative_complete.decoding.forward.gguf_header import read_header

    vocab = read_header(path).tensors["token_embd.weight"].shape[0]

    started = time.perf_counter()
    try:
        binary = llama_server_binary(build=args.isa == "native", variant=args.isa)
        server = LlamaServer(path, binary=binary, threads=2, context=4096).start()
    except LlamaServerError as exc:
        print(f"llama-server: {exc}", file=sys.stderr)
        return None
    load_s = time.perf_counter() - started
    try:
        rng = random.Random(0)
        prompt = [rng.randrange(vocab) for _ in range(args.context)]
        body = {
            "prompt": prompt,
            "n_predict": 32,
            "temperature": 0,
            "cache_prompt": False,
            "ignore_eos": True,
        }
        timings = post_json(f"{server.url}/completion", body)["timings"]
        assert server.process is not None
        found = {
            "load_s": load_s,
            "prefill_ms_per_token": timings["prompt_per_token_ms"],
            "step_ms": timings["predicted_per_token_ms"],
            "rss_mb": _rss_mb(server.process.pid),
        }
        found.update(peer_batches(server, prompt, vocab, args.steps, rng))
        if "verify8_ms" in found:
            found["verify8_steps"] = found["verify8_ms"] / found["step_ms"]
        return found
    finally:
        server.stop()


def peer_batches(
    server: LlamaServer, prompt: list[int], vocab: int, steps: int, rng: random.Random
) -> dict[str, float]:
    """llama-server's passes over 2, 4 and 8 new tokens after ``prompt`` (its ``prompt_ms`` for
    them, the prompt itself from its cache), the widths in turn as ours, median of ``steps``. Its
    batch computes logits for the last token only, where a verify pass needs every row's: a figure
    at most what its verify would cost. A pass that fed more than its new tokens is not counted."""

    def timings_of(tokens: list[int]) -> dict[str, Any]:
        body = {"prompt": tokens, "n_predict": 1, "temperature": 0, "cache_prompt": True}
        return post_json(f"{server.url}/completion", body)["timings"]

    timings_of(prompt)  # the prompt into its cache
    times: dict[int, list[float]] = {width: [] for width in WIDTHS[1:]}
    for _ in range(steps):
        for width in WIDTHS[1:]:
            timings = timings_of(prompt + [rng.randrange(vocab) for _ in range(width)])
            if timings["prompt_n"] == width:  # the prompt's own tokens came from the cache
                times[width].append(timings["prompt_ms"])
    return {f"verify{width}_ms": statistics.median(taken) for width, taken in times.items() if taken}


def cpu_facts() -> dict[str, str]:
    import torch

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    flags = next(
        (
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        [],
    )
    simd = " ".join(f for f in flags if f.startswith(("avx", "fma", "f16c", "amx")))
    return {"cpu": model, "flags": simd, "torch_capability": torch.backends.cpu.get_cpu_capability()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.models_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--models", default="default")
    parser.add_argument("--backends", default="native,torch")
    parser.add_argument("--no-peer", action="store_true", help="skip llama-server")
    parser.add_argument("--isa", default="native", choices=["native", "avx2"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one model, print JSON
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(measure_ours(args.one, args.context, args.steps)))
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for spec in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = model_path(spec)
        runs: dict[str, list[dict[str, Any]]] = {b: [] for b in [*backends, "llama.cpp"]}
        read_through(path)
        for number in range(args.rounds):
            order = [*backends, *([] if args.no_peer else ["llama.cpp"])]
            for backend in order if number % 2 == 0 else order[::-1]:
                found = run_peer(path, args) if backend == "llama.cpp" else run_ours(path, backend, args)
                if found is not None:
                    runs[backend].append(found)
                    print(f"{spec} {backend}: step {found['step_ms']:.1f} ms", file=sys.stderr)
        results[spec] = {b: r for b, r in runs.items() if r}
    summary = {spec: {b: _median(r) for b, r in runs.items()} for spec, runs in results.items()}
    print(format_table(summary, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = {**vars(args), "out": str(args.out), **cpu_facts()}
    args.out.write_text(json.dumps({"config": config, "summary": summary, "runs": results}, indent=1) + "\n")
    return 0


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and all(k in r for r in runs)]
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}


def format_table(summary: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    facts = cpu_facts()
    header = f"{'model':<28}{'backend':<11}{'load s':>8}{'RSS MB':>9}{'step ms':>9}{'v2':>7}{'v4':>7}"
    lines = [
        f"{facts['cpu']} ({facts['flags']}; torch {facts['torch_capability']})",
        f"isa {args.isa}; context {args.context}",
        header + f"{'v8':>7}{'v8/step':>8}{'pf ms/t':>9}{'x peer step':>12}",
    ]
    for spec, backends in summary.items():
        peer = backends.get("llama.cpp", {}).get("step_ms")
        for backend, s in backends.items():
            ratio = f"{s['step_ms'] / peer:.2f}" if peer else "-"
            lines.append(
                f"{spec[:27]:<28}{backend:<11}{s['load_s']:>8.1f}{s['rss_mb']:>9.0f}{s['step_ms']:>9.1f}"
                f"{s.get('verify2_ms', 0):>7.1f}{s.get('verify4_ms', 0):>7.1f}{s.get('verify8_ms', 0):>7.1f}"
                f"{s.get('verify8_steps', 0):>8.2f}{s['prefill_ms_per_token']:>9.2f}{ratio:>12}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
