"""``python -m speculative_complete.decoding``: one generation, or a batch, from the shell.

The model loads once per invocation; with ``--json`` each prompt gives one JSON line with its
id, text, token ids and stats, so the command doubles as a scripting and benchmarking tool.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from pathlib import Path

from speculative_complete.decoding.drafters import DRAFTER_NAMES, load_head_drafter, make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.models.loading import (
    QUANTIZATIONS,
    ModelLoadError,
    check_draft_compatible,
    load_model,
)
from speculative_complete.decoding.results import GenerationResult

log = logging.getLogger("speculative_complete.decoding")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m speculative_complete.decoding", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default="default", help="folder, .gguf file, cached hub id or 'default'")
    parser.add_argument("--draft-model", default=None, help="draft model sharing the target's vocabulary")
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, default="auto")
    parser.add_argument(
        "--draft-head", default="auto", help="auto (the head shipped for the model), none, or a head's folder"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop-at-newline", action="store_true", help="stop at the end of the line")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="auto",
        help="auto: a GGUF keeps its quantized blocks on the CPU; none: dequantize; "
        "int4/int8: also quantize a safetensors Llama at load",
    )
    parser.add_argument("--trust-remote-code", action="store_true")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt-file", type=Path, help="the prompt, verbatim")
    source.add_argument("--prompts-jsonl", type=Path, help="one JSON object per line: prompt, optional id")
    parser.add_argument("--json", action="store_true", help="one JSON object per prompt on stdout")
    parser.add_argument("--log-level", default="WARNING")
    return parser.parse_args(argv)


def read_prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.prompt_file is not None:
        return [("0", args.prompt_file.read_text(encoding="utf-8", errors="replace"))]
    prompts = []
    for number, line in enumerate(args.prompts_jsonl.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{args.prompts_jsonl}:{number}: expected an object with a 'prompt' field"
            ) from exc
        if not isinstance(prompt, str):
            raise ValueError(f"{args.prompts_jsonl}:{number}: 'prompt' must be a string")
        prompts.append((str(record.get("id", len(prompts))), prompt))
    return prompts


def report(prompt_id: str, result: GenerationResult, as_json: bool, many: bool) -> None:
    """One completion on stdout: a JSON line, or the text (timings to the log)."""
    if as_json:
        record = {
            "id": prompt_id,
            "text": result.text,
            "token_ids": result.token_ids,
            "stop_reason": result.stop_reason,
            "stats": result.stats.to_dict(),
        }
        print(json.dumps(record), flush=True)
        return
    sys.stdout.write(result.text + ("\n" if many else ""))
    sys.stdout.flush()
    stats = result.stats
    log.info(
        "%s: %d tokens, %.2f tokens/pass, prefill %.0f ms, decode %.0f ms",
        prompt_id,
        stats.new_tokens,
        stats.tokens_per_pass,
        stats.prefill_ms,
        stats.decode_ms,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        prompts = read_prompts(args)
        load = functools.partial(
            load_model,
            device=args.device,
            dtype=args.dtype,
            quantization=args.quantization,
            trust_remote_code=args.trust_remote_code,
        )
        target = load(args.model)
        draft = None
        if args.draft_model:
            draft = load(args.draft_model)
            check_draft_compatible(target, draft)
        engine = SpeculativeEngine(target)
        head = load_head_drafter(target, args.draft_head, cost=engine.cost)
        drafter = make_drafter(
            args.drafter,
            draft_model=draft,
            draft_head=head,
            cost=engine.cost,
            target_vocab=target.vocab_size,
        )
    except (ModelLoadError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_strings=tuple(args.stop),
        stop_at_newline=args.stop_at_newline,
    )
    for prompt_id, prompt in prompts:
        report(prompt_id, engine.generate_text(prompt, config, drafter), args.json, many=len(prompts) > 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
