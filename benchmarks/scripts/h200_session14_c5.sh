#!/usr/bin/env bash
# Session 14, call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz), the budget's last minutes:
# the verdict kernels' GPU tests with the relay's exactness and stage/commit tests, then the relay
# alone (--profile, 32 tokens) to read the verify graph's tail against call 3's profile.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 130 $PYT --timeout 100 --timeout-method thread tests/test_greedy_verdict.py \
    tests/test_relay.py tests/test_stage_commit.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
decode_as 0 decode_verdict 130 lingc-nextn 32
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
