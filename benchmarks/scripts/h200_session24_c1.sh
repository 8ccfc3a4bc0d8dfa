#!/usr/bin/env bash
# Session 24 call 1 on ONE H200 (carry .whl; the Triton cache is cold this session): every single-GPU test file on
# the session's first commit (session 23's last full run was call 4 on 8fffd6d; f624dd7's
# one-reduction rmsnorm_router ran the router, rmsnorm_router and relay files only), then a
# profiled plain + relay decode: the reference for the session's A/B calls.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 380 $PYT --timeout 240 --timeout-method thread \
    tests/ --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_table 165 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound" "$OUT"/decode_table.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
