#!/usr/bin/env bash
# Session 23 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): lingc.rmsnorm_router with ONE
# reduction per row (sum of squares and gate products together, the norm's scale after the sum;
# call 4's form reduced twice per row and lost at T = 6). The router / rmsnorm_router / relay GPU
# tests, then decode plain + relay with the fold, then without it (prelude), in this call.
set -u
DURATIONS=3 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 $PYT tests/test_rmsnorm_router.py tests/test_moe_kernels.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_fold1 125 lingc,lingc-nextn 48
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_router_norm = False" \
    decode_as 0 decode_nofold 125 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound|_moe_router_logits|_rmsnorm_kernel" "$OUT"/decode_*.log
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
