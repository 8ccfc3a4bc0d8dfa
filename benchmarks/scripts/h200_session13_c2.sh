#!/usr/bin/env bash
# Session 13, call 2 on ONE H200 (carry .whl and .triton_cache.tar.gz): the lm_head GEMM + argmax
# launch configs (issue 4's target: 85% of copy bandwidth; the table's 64 x 1 ran at 80%), at
# M = 1 (plain decode, each draft forward) and M = 6 (verify), cold weights.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.gemm_sweep --out "$OUT" --m 1 6 \
    --shapes "lm_head argmax" 2>&1 | stamp > "$OUT/gemm_sweep_argmax.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
