#!/usr/bin/env bash
# Session 14, call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file on
# d74bc8e (L2 prefetch before the PDL wait in MLA's split kernel and the 26 MB design-A GEMMs;
# session 13's last commits had not run on a GPU), then flash-tp4-rank decode (plain and relay,
# --profile) with the prefetches on and, in the same install, off (LINGC_L2_PREFETCH=0).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
decode_as 0 decode_prefetch 150 lingc,lingc-nextn 48
decode_as 0 decode_noprefetch 170 lingc,lingc-nextn 48 LINGC_L2_PREFETCH=0
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
