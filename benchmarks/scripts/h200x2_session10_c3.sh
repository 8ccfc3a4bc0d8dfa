#!/usr/bin/env bash
# Session 10, call 3, on a 2-GPU H200 host (nvidia-h200-x2): design C, third form (K across the
# CTA's threads as in the first, weights converted to fp32 once, x converted once per row:
# the per-row work one FMA per weight element) after call 2 found the second ALU-bound at M=6.
#   GPU 1: the GEMM sweep (M 1 and 6) on the decode step's projection shapes, then lingc plain +
#          relay decode with each swept shape on its best design-C config;
#   GPU 0: the GEMM GPU tests, then (once the sweep is written) lingc plain + relay decode with
#          each swept shape on its best config of any design over M 1 + 6 (a table candidate).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
(gemm_sweep_as 1 150 "${DECODE_SHAPES[@]}"
 decode_on_sweep 1 decode_c 200 lingc,lingc-nextn 48 C) &
(CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_gemm.py tests/test_benchmark_smoke.py 2>&1 | stamp > "$OUT/pytest_gemm.log"
 for _ in $(seq 200); do [ -f "$OUT/gemm_sweep.json" ] && break; sleep 2; done
 decode_on_sweep 0 decode_best 200 lingc,lingc-nextn 48 "") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
