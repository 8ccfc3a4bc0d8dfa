#!/usr/bin/env bash
# Session 13, call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 80a7727):
#   1. GPU tests of the GEMM files (gemm_argmax now folds packed keys with atomic_max), the
#      relay's exactness tests and flash-tp4-rank batch invariance;
#   2. the lm_head argmax launch table entry timed alone (gemm_sweep, M = 1 and 6);
#   3. flash-tp4-rank decode, lingc plain and relay with --profile, on this checkout (5bba1f4),
#      then on 80a7727 (the argmax as before) on the same GPU.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 100 --timeout-method thread tests/test_gemm.py \
    tests/test_relay.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.gemm_sweep --out "$OUT/g" --m 1 6 \
    --shapes "lm_head argmax" 2>&1 | stamp > "$OUT/gemm_sweep_argmax.log"
decode_as 0 decode_new 170 lingc,lingc-nextn 48
BASE=1 decode_as 0 decode_base 200 lingc,lingc-nextn 48
save_triton_cache
rm -rf "$OUT/g"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
