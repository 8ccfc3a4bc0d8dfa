#!/usr/bin/env bash
# Session 10, call 2, on a 2-GPU H200 host (nvidia-h200-x2): design C rewritten after call 1
# (one weight row per warp, warp-local reductions, optional x look-ahead).
#   GPU 0: the GEMM GPU tests (design C on the model's shapes, batch invariance), then lingc
#          plain + relay decode with the table as committed;
#   GPU 1: the GEMM sweep (M 1 and 6) on the decode step's projection shapes, then lingc plain +
#          relay decode with each swept shape on its best design-C config.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_gemm.py 2>&1 | stamp > "$OUT/pytest_gemm.log"
 decode_as 0 decode_table 200 lingc,lingc-nextn 48) &
(gemm_sweep_as 1 150 "${DECODE_SHAPES[@]}"
 decode_on_sweep 1 decode_c 200 lingc,lingc-nextn 48 C) &
wait
save_triton_cache; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
