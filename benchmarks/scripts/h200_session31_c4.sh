#!/usr/bin/env bash
# Session 31 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = `git archive` of
# the commit before benchmarks/results/select_wsum_overlap_s31.patch, applied with `git am`): the
# MoE router selection's weights' sum reduced beside the tie check, before the branch (same bits),
# A/B in one call: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile, 32
# tokens) on the baseline, then on this checkout; then the router's GPU tests.
# Expected ~260 s; run with timeout_s 330.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 120 lingc,lingc-nextn 32
decode_as 0 decode_head 120 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *[0-9.]+ \| lingc|greedy|copy band" "$OUT/$f.log" | tail -5; done
CUDA_VISIBLE_DEVICES=0 timeout 80 $PYT tests/test_moe_kernels.py tests/test_rmsnorm_router.py \
    2>&1 | stamp > "$OUT/pytest_gpu_router.log"
tail -2 "$OUT/pytest_gpu_router.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_router.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
