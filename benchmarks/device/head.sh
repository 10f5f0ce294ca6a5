#!/usr/bin/env bash
# Issue 18's GPU figures (the draft head on the graphed forward), in one call of ~4 minutes after
# `stage.sh a` and `stage.sh b` (carry .devmodel/c): the head's CUDA tests, then decode_bench's
# head methods and a one-file replay with and without the head. Each step has its own time limit
# (SIGINT: decode_bench still writes what it measured), and every log and result lands in $OUT.
source benchmarks/device/env.sh || exit 1
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT 90 python3 -m pytest -q tests/decoding/forward/test_graphed.py -p no:cacheprovider \
  -k "draft_head_drafts_beside and cuda" 2>&1 | tee "$OUT/tests.log"
timeout -s INT 110 python3 -m benchmarks.decode_bench --device cuda --dtype bfloat16 --n 20 \
  --no-draft-model --no-peers --out "$OUT/decode_bench_cuda_head.json" > "$OUT/decode.log" 2>&1
tail -24 "$OUT/decode.log"
# two files took over 4 minutes (the keystrokes are typed in real time): one here
timeout -s INT 170 python3 -m benchmarks.replay --files 1 --configs shipped,no_head --baseline no_head \
  --out "$OUT/replay_cuda_head.json" 2>&1 | tee "$OUT/replay.log" | grep -v logMessage
