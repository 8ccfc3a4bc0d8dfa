#!/usr/bin/env bash
# Session 13, call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 15ff263):
#   1. GPU tests of the KDA kernels and stage/commit, the
#      relay's exactness tests and flash-tp4-rank batch invariance;
#   2. flash-tp4-rank decode, lingc plain and relay with --profile, on this checkout (KDA state before the wait),
#      then on 15ff263 (state after the wait) on the same GPU.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 100 --timeout-method thread tests/test_kda_kernel.py tests/test_stage_commit.py \
    tests/test_relay.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
decode_as 0 decode_new 170 lingc,lingc-nextn 48
BASE=1 decode_as 0 decode_base 200 lingc,lingc-nextn 48
save_triton_cache
rm -rf "$OUT/g"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
