#!/usr/bin/env bash
# Session 11, call 5 on ONE H200 (the 2-GPU host was not lent; carry .whl, .triton_cache.tar.gz,
# .base.tar.gz = f900f64): the final check, in the budget left (~8 min).
#   1. the relay on this checkout (KDA commits merged into kda_commit_many), then on f900f64
#      (lingc as in 39de3ba), one after the other on the same GPU;
#   2. the GPU tests of what changed: the KDA kernels, pdl_swap / stage_commit, the relay's
#      exactness and run-ahead tests, batch invariance at flash-tp4-rank.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
decode_as 0 decode_final 170 lingc-nextn 48
BASE=1 decode_as 0 decode_base 150 lingc-nextn 48
CUDA_VISIBLE_DEVICES=0 timeout 140 $PYT --timeout 100 --timeout-method thread tests/test_kda_kernel.py \
    tests/test_pdl_swap.py tests/test_stage_commit.py tests/test_relay.py tests/test_batch_invariance.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
