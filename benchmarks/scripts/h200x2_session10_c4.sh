#!/usr/bin/env bash
# Session 10, call 4, on a 2-GPU H200 host (nvidia-h200-x2): design C with its weight loads kept
# out of L1 (.cg) and x loads cached there (.ca), after call 3 found the M = 6 time set by every
# CTA re-reading x (13 MB of L2 reads per x row on the fused KDA shape at 2 rows per CTA).
#   GPU 1: the GEMM sweep (M 1 and 6), then lingc plain + relay decode on the best C configs;
#   GPU 0: every single-GPU test file.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
(gemm_sweep_as 1 150 "${DECODE_SHAPES[@]}"
 decode_on_sweep 1 decode_c 200 lingc,lingc-nextn 48 C) &
(CUDA_VISIBLE_DEVICES=0 timeout 400 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
