#!/usr/bin/env bash
# Session 17 call 2 (prepared in session 16) on ONE H200 (carry .whl, .triton_cache.tar.gz):
# decode, plain + relay: this checkout against LOGITS_ROWS = 8 (the router logits' chunked form:
# one cross-warp reduction per 8 rows instead of per row; set by a prelude), same call.
set -u
source "$(dirname "$0")/device_env.sh"
decode_as 0 decode_rows1 130 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.LOGITS_ROWS = 8" \
    decode_as 0 decode_rows8 130 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_moe_router_logits" "$OUT"/decode_*.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
