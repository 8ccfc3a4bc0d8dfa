#!/usr/bin/env bash
# One device call on a 4-GPU H200 host (the device tool's nvidia-h200-x4), everything in parallel:
#   GPU 0     single-GPU decode benchmark of flash-tp4-rank (the TP1 side of TP2 vs TP1)
#   GPU 1,2   the same preset 2-way tensor parallel (NCCL and symm-mem all-reduce), then the TP2 GPU tests
#   GPU 3     the single-GPU GPU test suite
# Logs and JSON go under $OUT. NVLink multicast stays off.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/gpus.csv"
LIMIT=${LIMIT:-530}
BENCH="--preset flash-tp4-rank --context 8192 --lingc-inductor 0 --tokens 96"
(CUDA_VISIBLE_DEVICES=0 timeout $LIMIT python3 -m benchmarks.decode $BENCH \
    --modes eager,lingc,lingc-nextn --out "$OUT/tp1" > "$OUT/tp1.log" 2>&1; echo "rc $?" >> "$OUT/tp1.log") &
(CUDA_VISIBLE_DEVICES=1,2 timeout $((LIMIT - 190)) torchrun --nproc-per-node 2 -m benchmarks.decode --tp 2 $BENCH \
    --modes eager,lingc,lingc-nextn,lingc-nextn-symm --out "$OUT/tp2" > "$OUT/tp2.log" 2>&1; echo "rc $?" >> "$OUT/tp2.log";
 CUDA_VISIBLE_DEVICES=1,2 timeout 180 python3 -m pytest -m gpu -p no:logging --tb=short -v \
    tests/test_tensor_parallel.py > "$OUT/pytest_tp2.log" 2>&1; echo "rc $?" >> "$OUT/pytest_tp2.log") &
(CUDA_VISIBLE_DEVICES=3 timeout $LIMIT python3 -m pytest -m gpu -p no:logging --tb=short -v --durations=20 \
    tests --ignore=tests/test_tensor_parallel.py > "$OUT/pytest_gpu.log" 2>&1; echo "rc $?" >> "$OUT/pytest_gpu.log") &
wait
