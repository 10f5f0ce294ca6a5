#!/usr/bin/env bash
# The draft head trained on a lent GPU (issue 18): the shipped head, trained on every
# training-side token of the stdlib for as many epochs as fit in TRAIN_MINUTES (4 by default),
# with each batch's states computed on the GPU (speculative_complete/decoding/draft_head/features.py). One call of ~9
# minutes after `stage.sh a` and `stage.sh b` (carry .devmodel/c). The head and its report (on
# the device's held-out files) land in $OUT/head; back here,
#   python -m speculative_complete.decoding.draft_head.training --epochs 0 --init <files_at>/head --out DIR
# reports it on this machine's held-out shards (the quantized forward's states, as the server's).
source benchmarks/device/env.sh || exit 1
set -o pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout -s INT 120 python3 -m pytest -q tests/decoding/draft_head/test_training.py -p no:cacheprovider \
  -k "on_cuda or per_batch" 2>&1 | tail -3 | tee "$OUT/tests.log"
grep -q "passed" "$OUT/tests.log" && ! grep -q "failed" "$OUT/tests.log" || exit 1
timeout -s INT 450 python3 -m speculative_complete.decoding.draft_head.training --device cuda --init shipped \
  --tokens 20000000 --epochs 20 --max-minutes "${TRAIN_MINUTES:-4}" --batch 64 --lr "${LR:-8e-4}" \
  --out "$OUT/head" > "$OUT/train.log" 2>&1
echo "rc $?"
tr '\r' '\n' < "$OUT/train.log" | grep -v '%|' | tail -30
tr '\r' '\n' < "$OUT/train.log" | grep '100%|' | tail -12
