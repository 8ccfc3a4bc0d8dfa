#!/usr/bin/env bash
# Session 15, call 1 on ONE H200 (carry .whl; this checkout is new, so no Triton cache: the call
# JITs everything and packs the cache it used for the later calls):
#   - every single-GPU test file on 3f18a6f (session 14's last commits had not run on a GPU:
#     the verdict kernels' rename and launch_kwargs refactor);
#   - flash-tp4-rank decode, context 8192, lingc plain and relay, 48 tokens: the session's
#     baseline.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 360 $PYT --timeout 250 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"
decode_as 0 decode_base 190 lingc,lingc-nextn 48
grep -E "^\| lingc" "$OUT/decode_base.log" | head
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
