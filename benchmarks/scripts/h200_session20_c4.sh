#!/usr/bin/env bash
# A record: it ran on an uncommitted tree with LOGITS_X_AHEAD and moe_sweep's rows-ahead
# variants, reverted after call 4 (results README, Session 20); it does not run as written now.
# Session 20 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): the router GPU tests, then the
# relay decode (--profile) with the router logits requesting 1 x row ahead (the former table,
# through a prelude) against 3 (LOGITS_X_AHEAD, the table now), in one call.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 90 $PYT --timeout 80 --timeout-method thread tests/test_moe_kernels.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.LOGITS_X_AHEAD = 1" \
    decode_as 0 decode_relay_ahead1 150 lingc-nextn 48
decode_as 0 decode_relay_ahead3 150 lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_moe_router" "$OUT"/decode_*.log
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
