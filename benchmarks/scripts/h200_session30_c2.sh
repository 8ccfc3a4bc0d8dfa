#!/usr/bin/env bash
# Session 30 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 3bc0679, the
# commit before the MoE pair-load hoist), three decode runs in one call (flash-tp4-rank, context
# 8192, lingc plain and relay, --profile, 32 tokens):
#   base: 3bc0679 (the router's fast picks, call 1);
#   head: + the hoist (a routed up-GEMM block requests its pairs with its expert id; the
#         down-GEMM its pairs before the wait; T > 1 only: the relay's verify and extend);
#   full: + the selection's picks on the row's whole [8, 64] tile (the group picks one redux each
#         too, no kept-tile reload), from benchmarks/scripts/s30_full_tile.patch (untracked);
# then the GPU tests of the router, the MoE and the relay gates on the patched tree.
# Expected ~400 s; run with timeout_s 595.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 170 lingc,lingc-nextn 32
decode_as 0 decode_head 170 lingc,lingc-nextn 32
patch -p1 < benchmarks/scripts/s30_full_tile.patch > /dev/null && echo "patched"
decode_as 0 decode_full 170 lingc,lingc-nextn 32
for f in decode_base decode_head decode_full; do grep -E "^ *[0-9.]+ \| lingc|greedy" "$OUT/$f.log" | tail -3; done
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_moe_kernels.py tests/test_rmsnorm_router.py tests/test_fused_moe.py \
    tests/test_moe_experts.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_moe.log"
tail -2 "$OUT/pytest_gpu_moe.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_moe.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
