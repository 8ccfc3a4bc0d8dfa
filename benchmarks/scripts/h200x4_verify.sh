#!/usr/bin/env bash
# The next device call, prepared (nvidia-h200-x4, everything in parallel, logs and JSON under $OUT):
#   GPU 0     the single-GPU GPU test suite (-v: each result is logged as it happens)
#   GPU 1,2   the 2-GPU tensor-parallel GPU tests (NCCL + CUDA graphs; symm-mem all-reduce)
#   GPU 3     flash-tp4-rank decode: lingc plain and relay after the graph changes of 1b6e177,
#             643d5fc and 3d0f3e4, and the modes not measured yet (Inductor, reduce-overhead-pdl,
#             eager-nextn)
set -u
source "$(dirname "$0")/device_env.sh"
LIMIT=${LIMIT:-540}
(CUDA_VISIBLE_DEVICES=0 timeout $LIMIT python3 -m pytest -m gpu -p no:logging --tb=short -v --durations=20 \
    tests --ignore=tests/test_tensor_parallel.py > "$OUT/pytest_gpu.log" 2>&1; echo "rc $?" >> "$OUT/pytest_gpu.log") &
(CUDA_VISIBLE_DEVICES=1,2 timeout $LIMIT python3 -m pytest -m gpu -p no:logging --tb=short -v \
    tests/test_tensor_parallel.py > "$OUT/pytest_tp2.log" 2>&1; echo "rc $?" >> "$OUT/pytest_tp2.log") &
(CUDA_VISIBLE_DEVICES=3 timeout $LIMIT python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --tokens 96 --modes ${MODES:-lingc,lingc-nextn,eager-nextn,inductor,reduce-overhead,reduce-overhead-pdl} \
    --out "$OUT/tp1" > "$OUT/tp1.log" 2>&1; echo "rc $?" >> "$OUT/tp1.log") &
wait
