#!/usr/bin/env bash
# Session 8, call 2, on a 2-GPU H200 host (nvidia-h200-x2): the PDL trigger placement.
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile) with the trigger
#          before the wait (LINGC_PDL_TRIGGER=early), then after it (late), then
#          plain early with the fused KDA projection on design B (whole chunk before the wait);
#   GPU 1: every single-GPU test file under LINGC_PDL_TRIGGER=early.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(decode_as 0 decode_early 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=early
 decode_as 0 decode_late 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=late
 PRELUDE="import lingc.runtime.kernels.gemm.config as c
c.CONFIGS[(5128, 2560)] = c._b(64, 5, 8)" decode_as 0 decode_early_kdaB 120 lingc 48 LINGC_PDL_TRIGGER=early) &
(CUDA_VISIBLE_DEVICES=1 LINGC_PDL_TRIGGER=early timeout ${P1:-540} $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu_early.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
