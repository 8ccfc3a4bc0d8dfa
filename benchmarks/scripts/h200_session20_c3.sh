#!/usr/bin/env bash
# A record: it ran on an uncommitted tree with LOGITS_X_AHEAD and moe_sweep's rows-ahead
# variants, reverted after call 4 (results README, Session 20); it does not run as written now.
# Session 20 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the router logits loop with
# more x rows requested ahead of the row it reduces (LOGITS_X_AHEAD, the same bits):
#   1. benchmarks.moe_sweep --set router at T = 1, 2, 6, 8 (block_e, warps, rows ahead);
#   2. decode plain + relay (--profile): LOGITS_X_AHEAD = 1 (the table) against 3, in one call.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.moe_sweep --set router --t 1 2 6 8 \
    --out "$OUT/ms" 2>&1 | stamp > "$OUT/moe_sweep_router.log"
grep -E "router|align" "$OUT/moe_sweep_router.log" | tail -40; rm -rf "$OUT/ms"
decode_as 0 decode_ahead1 140 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.LOGITS_X_AHEAD = 3" \
    decode_as 0 decode_ahead3 140 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_moe_router" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
