#!/usr/bin/env bash
# The full Ling-3.0-flash preset (random bf16 weights), 4-way tensor parallel on 4 H200s (the
# device tool's nvidia-h200-x4), context 8192: lingc relay and plain decode (symm-mem all-reduce),
# Inductor reduce-overhead, eager. Rank 0 writes $OUT/flash_tp4/decode_tp4.json and the log.
# DEBUG_TESTS (optional) runs those GPU tests first on GPU 0 with -x, for their tracebacks.
set -u
source "$(dirname "$0")/device_env.sh"
i=0
for t in ${DEBUG_TESTS:-}; do   # one pytest per test id, each with its own time limit
  i=$((i + 1))
  CUDA_VISIBLE_DEVICES=0 timeout ${DEBUG_LIMIT:-60} python3 -m pytest -m gpu -p no:logging --tb=long -x -q \
      "$t" > "$OUT/pytest_debug$i.log" 2>&1; echo "rc $?" >> "$OUT/pytest_debug$i.log"
done
timeout ${LIMIT:-470} torchrun --nproc-per-node 4 -m benchmarks.decode --tp 4 --preset flash --context 8192 \
    --lingc-inductor 0 --tokens 64 --modes ${MODES:-lingc-nextn-symm,lingc-symm,eager,reduce-overhead} \
    --out "$OUT/flash_tp4" > "$OUT/flash_tp4.log" 2>&1
echo "rc $?" >> "$OUT/flash_tp4.log"
