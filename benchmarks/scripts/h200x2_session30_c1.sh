#!/usr/bin/env bash
# Session 30 call 1 on a 2-GPU H200 host (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 7baccf6,
# the session's start): the MoE router's selection on int32 keys with one redux.sync a pick
# (exact int64 picks only on near ties), A/B in one call.
#   GPU 0: every single-GPU test file's GPU tests (the router's redux packs among them), then
#          the Triton cache for later calls;
#   GPU 1: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile, 32 tokens) on
#          the baseline, then on this checkout.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
(gpu_tests 420; save_triton_cache) &
(BASE=1 decode_as 1 decode_base 200 lingc,lingc-nextn 32
 decode_as 1 decode_head 200 lingc,lingc-nextn 32) &
wait
for f in decode_base decode_head; do grep -E "lingc|greedy|floor" "$OUT/$f.log" | grep -v Warn | tail -6; done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
