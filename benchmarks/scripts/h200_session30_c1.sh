#!/usr/bin/env bash
# Session 30 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 7baccf6, the
# session's start): the MoE router's selection on int32 keys with one redux.sync a pick (exact
# int64 picks only on near ties), A/B in one call: flash-tp4-rank decode (context 8192, lingc
# plain and relay, --profile, 32 tokens) on the baseline, then on this checkout; then the GPU
# tests of the router, the MoE and the relay's speculative == plain gates.
# Expected ~450 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 170 lingc,lingc-nextn 32
decode_as 0 decode_head 170 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *lingc|greedy|copy band" "$OUT/$f.log" | tail -5; done
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_moe_kernels.py tests/test_rmsnorm_router.py tests/test_fused_moe.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_router.log"
tail -2 "$OUT/pytest_gpu_router.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_router.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
