#!/usr/bin/env bash
# Issue 41's GPU figures in one call of ~6 minutes after `stage.sh a` and `stage.sh b` (carry
# .devmodel/c): the shape-true 7B/0.5B pair at controlled acceptance and the default model's
# 4-bit blocks against dense bf16 (benchmarks/gpu_pair.py), the graphed forward's CUDA tests, and
# decode_bench with the draft model graphed. Each step has its own time limit; every log and
# result lands in $OUT.
source benchmarks/device/env.sh || exit 1
set -o pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -s INT 170 python3 -m benchmarks.gpu_pair --default-model --out "$OUT/gpu_pair.json" \
  > "$OUT/gpu_pair.log" 2>&1
echo "gpu_pair rc $?"; grep -v "^ " "$OUT/gpu_pair.log" | tail -12; cat "$OUT/gpu_pair.json" 2>/dev/null | head -80
timeout -s INT 150 python3 -m pytest -q tests/decoding/forward/test_graphed.py -p no:cacheprovider -x \
  -k "cuda and (one_row or 4bit or device_path or default_model_runs or every_split or speculative_greedy)" \
  2>&1 | tail -15 | tee "$OUT/tests.log"
timeout -s INT 110 python3 -m benchmarks.decode_bench --device cuda --dtype bfloat16 --n 10 \
  --no-peers --out "$OUT/decode_bench_cuda.json" > "$OUT/decode.log" 2>&1
echo "decode_bench rc $?"; tail -24 "$OUT/decode.log"
