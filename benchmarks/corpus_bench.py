"""The workspace index's costs: tokenizing, building the suffix array, one lookup, and memory,
on a slice of the stdlib as the workspace, with the default model's tokenizer.

    python -m benchmarks.corpus_bench [--mb 2 4 8] [--lookups 2000]

For comparison, the open documents' per-stream index (``ngram.TokenIndex``, a dict per n-gram)
is built over the first 200k tokens and its memory measured the same way (traced allocations).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from pathlib import Path

from benchmarks.decode_bench import stdlib_files, write_json

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "corpus_bench.json"


def texts_up_to(limit_bytes: int) -> list[str]:
    texts, total = [], 0
    for _, path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) > 256 << 10:
            continue
        if total + len(text) > limit_bytes:
            break
        texts.append(text)
        total += len(text)
    return texts


def measure(mb: float, encode, lookups: int) -> dict[str, float]:
    from speculative_complete.decoding.corpus_index import CorpusIndex

    texts = texts_up_to(int(mb * (1 << 20)))
    started = time.perf_counter()
    documents = [encode(text) for text in texts]
    tokenized = time.perf_counter()
    index = CorpusIndex(documents)
    built = time.perf_counter()
    rng = random.Random(0)
    queries, nonempty = [], [doc for doc in documents if doc]
    for _ in range(lookups):  # the text before a cursor: a stretch of some file, cut anywhere
        doc = rng.choice(nonempty)
        end = rng.randint(1, len(doc))
        queries.append(doc[max(0, end - 64) : end])
    t0 = time.perf_counter()
    found = sum(index.longest(query, 16, min_length=2) is not None for query in queries)
    looked = time.perf_counter()
    return {
        "mb": mb,
        "files": len(texts),
        "tokens": len(index),
        "tokenize_s": round(tokenized - started, 3),
        "build_s": round(built - tokenized, 3),
        "lookup_us": round((looked - t0) / lookups * 1e6, 1),
        "found_share": round(found / lookups, 3),
        "index_mb": round(index.nbytes / (1 << 20), 2),
    }


def dict_index_bytes_per_token(encode) -> float:
    from speculative_complete.decoding.drafters.ngram import TokenIndex

    tokens = [t for text in texts_up_to(1 << 20) for t in encode(text)][:200_000]
    tracemalloc.start()
    index = TokenIndex(tokens)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del index
    return round(size / len(tokens), 1)


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.corpus_bench", description=description)
    parser.add_argument("--mb", type=float, nargs="+", default=[2, 4, 8])
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    from speculative_complete.decoding.models.loading import load_model

    tokenizer = load_model("default", device="cpu", dtype="float32").tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    rows = [measure(mb, encode, args.lookups) for mb in args.mb]
    per_token = dict_index_bytes_per_token(encode)
    for row in rows:
        print(
            f"{row['mb']:>5} MB  {row['files']:>4} files  {row['tokens']:>8} tokens"
            f"  tokenize {row['tokenize_s']:.2f} s  build {row['build_s']:.2f} s"
            f"  lookup {row['lookup_us']:.0f} us  index {row['index_mb']:.1f} MB"
            f"  (a match for {row['found_share']:.0%})"
        )
    print(f"the open documents' dict index: {per_token} bytes per token (the corpus index: 8)")
    write_json(args.out, {"rows": rows, "dict_index_bytes_per_token": per_token, "argv": sys.argv[1:]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
