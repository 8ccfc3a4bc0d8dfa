#!/usr/bin/env bash
# Session 16 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz):
#   1. the router's selection at 1, 2 and 4 keys per reduction pass, alone (moe_sweep --set router);
#   2. decode, plain + relay: this checkout (SELECT_PER_PASS = 4) against 1 (the former selection,
#      set by a prelude), same call;
#   3. every single-GPU test file on this checkout.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.moe_sweep --out "$OUT/moe" --set router --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
grep -E "router" "$OUT/moe_sweep.log"; cp "$OUT/moe/moe_sweep_flash-tp4-rank.json" "$OUT/moe_sweep_router.json"; rm -rf "$OUT/moe"
decode_as 0 d_p4 150 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.SELECT_PER_PASS = 1" \
    decode_as 0 d_p1 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|by kind|_moe_router_select" "$OUT"/d_*.log
CUDA_VISIBLE_DEVICES=0 timeout 220 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
