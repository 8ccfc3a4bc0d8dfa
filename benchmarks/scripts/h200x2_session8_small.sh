#!/usr/bin/env bash
# Session 8, call 6, on a 2-GPU H200 host (nvidia-h200-x2): the "small" PDL trigger placement
# (the norms release their dependents before their wait; every other kernel after).
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile) with
#          LINGC_PDL_TRIGGER=late, then small;
#   GPU 1: every single-GPU test file under LINGC_PDL_TRIGGER=small, then plain decode under small
#          with the fused KDA projection on design B (B bn64 sk5, 8 warps).
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(decode_as 0 decode_late 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=late
 decode_as 0 decode_small 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=small) &
(CUDA_VISIBLE_DEVICES=1 LINGC_PDL_TRIGGER=small timeout 330 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu_small.log"
 PRELUDE="import lingc.runtime.kernels.gemm.config as c
c.CONFIGS[(5128, 2560)] = c._b(64, 5, 8)" decode_as 1 decode_small_kdaB 120 lingc 48 LINGC_PDL_TRIGGER=small) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
