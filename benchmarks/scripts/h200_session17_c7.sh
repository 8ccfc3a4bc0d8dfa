#!/usr/bin/env bash
# Session 17 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz, and .base.tar.gz = `git archive
# --format=tar.gz -o .base.tar.gz d2b46e4`, the commit before lingc.concat_cols):
#   1. the concat kernel's, the relay's and the backend's GPU tests on this checkout;
#   2. decode, plain + relay (--profile): d2b46e4 (BASE=1) against this checkout, in one call
#      (the draft head's cat, a full edge before eh_proj, is lingc.concat_cols here).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_concat_cols.py \
    tests/test_relay.py tests/test_relay_advance.py tests/test_backend_gpu.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
base_setup
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 48
decode_as 0 decode_head 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains|_concat|Cat" "$OUT"/decode_*.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
