#!/usr/bin/env bash
# Session 13, call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz), the budget's last ~5 min:
# d56cf7c (the KDA state's early read now only on chains pdl_swap marks state_ready): the GPU tests
# of the KDA kernels, the relay's exactness and batch invariance, then flash-tp4-rank decode (plain
# and relay, --profile) to check the marked chains keep call 5's time.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 110 $PYT --timeout 90 --timeout-method thread tests/test_kda_kernel.py \
    tests/test_relay.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
decode_as 0 decode_new 120 lingc,lingc-nextn 32
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
