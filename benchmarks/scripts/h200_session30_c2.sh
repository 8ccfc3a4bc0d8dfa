#!/usr/bin/env bash
# Session 30 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 3bc0679, the
# commit before the MoE pair-load hoist). Three decode runs in one call (flash-tp4-rank, context
# 8192, lingc plain and relay, --profile, 32 tokens) and the MoE layer table:
#   base: 3bc0679 (the router's fast picks, call 1);
#   head: + the hoist (a routed up-GEMM block requests its pairs with its expert id; the
#         down-GEMM its pairs before the wait; T > 1 only: the relay's verify and extend);
#   the MoE layer against eager and Inductor default / max-autotune on head (`kernels_moe`, the
#         README's MoE rows, last measured before the toolchain pin);
#   full: + the selection's picks on the row's whole [8, 64] tile (the group picks one redux each
#         too, no kept-tile reload), from benchmarks/scripts/s30_full_tile.patch (untracked);
# then the GPU tests of the router, the MoE and the relay gates on the patched tree.
# Expected ~500 s; run with timeout_s 598.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 115 lingc,lingc-nextn 32
decode_as 0 decode_head 115 lingc,lingc-nextn 32
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_moe --out "$OUT/k" --inductor default max-autotune 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | grep -v "^ *triton_mm\|^ *strides\|^ *dtypes" \
    | stamp > "$OUT/kernels_moe.log"
cp "$OUT"/k/*.json "$OUT/" 2>/dev/null; rm -rf "$OUT/k"
patch -p1 < benchmarks/scripts/s30_full_tile.patch > /dev/null && echo "patched"
decode_as 0 decode_full 115 lingc,lingc-nextn 32
for f in decode_base decode_head decode_full; do grep -E "^ *[0-9.]+ \| lingc|greedy" "$OUT/$f.log" | tail -3; done
grep -E "^ *[0-9.]+ \| [16] \||MISSED|met|MET" "$OUT/kernels_moe.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 90 $PYT tests/test_moe_kernels.py tests/test_rmsnorm_router.py tests/test_fused_moe.py \
    tests/test_moe_experts.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_moe.log"
tail -2 "$OUT/pytest_gpu_moe.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_moe.log" | head
rm -f "$OUT/install.log"
# At most eight files come back: the three decode logs as one.
for f in decode_base decode_head decode_full; do echo "== $f"; cat "$OUT/$f.log"; done > "$OUT/decode_s30_c2.log" \
    && rm -f "$OUT"/decode_{base,head,full}.log
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
