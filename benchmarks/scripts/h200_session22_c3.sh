#!/usr/bin/env bash
# Session 22 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): above one token row the router
# logits CTA takes 8 experts instead of 4 (MANY_ROWS_BLOCK_E_FACTOR 2; the same bits; with 2 row
# groups, 128 CTAs). Call 2's sweep: T = 6 7.94 -> 6.62 us, T = 8 8.32 -> 7.42. Every single-GPU
# test file on this commit, the router sweep, decode plain + relay on the table, then the relay
# with the factor at 1 (call 2's ROW_GROUPS = 2 table) in the same call.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 $PYT --timeout 240 --timeout-method thread \
    tests/ --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.moe_sweep --set router --t 1 2 6 8 --out "$OUT/m" \
    2>&1 | stamp > "$OUT/moe_sweep_router.log"
grep -E "\| (1|2|6|8) \| router" "$OUT/moe_sweep_router.log"; rm -rf "$OUT/m"
decode_as 0 decode_table 150 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.MANY_ROWS_BLOCK_E_FACTOR = 1" \
    decode_as 0 decode_relay_f1 90 lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|_moe_router_logits" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
