#!/usr/bin/env bash
# Session 7, closing call, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: the MoE sweep's register-cap set (the table's up-GEMM cap, none, and a down-GEMM cap
#          too), then flash-tp4-rank decode, lingc plain and relay, --profile;
#   GPU 1: every single-GPU test file.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.moe_sweep --out "$OUT/m" --set regs 2>&1 | stamp > "$OUT/moe_sweep.log"
 cp "$OUT"/m/*.json "$OUT/moe_sweep.json"
 lingc_decode 0 ${P0:-240} --profile) &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-420} $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/m"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
