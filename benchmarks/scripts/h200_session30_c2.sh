#!/usr/bin/env bash
# Session 30 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = the commit
# before the MoE pair-load hoist): A/B of the hoist (a routed up-GEMM block requests its pairs
# with its expert id; the down-GEMM its pairs before the wait; T > 1 only, so the relay's
# verify and extend), flash-tp4-rank decode, context 8192, lingc plain and relay, --profile,
# 32 tokens; then every single-GPU test file's GPU tests.
# Expected ~500 s; run with timeout_s 595.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 170 lingc,lingc-nextn 32
decode_as 0 decode_head 170 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *[0-9.]+ \| lingc|greedy" "$OUT/$f.log" | tail -3; done
gpu_tests 300
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
