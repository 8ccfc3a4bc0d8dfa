#!/usr/bin/env bash
# Session 20 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, and .base.tar.gz = `git archive
# --format=tar.gz -o .base.tar.gz c4f140b`, the last commit before the fused align):
#   1. the MoE / router / align / fused_moe / relay GPU tests on this checkout;
#   2. decode, plain + relay (--profile): c4f140b (BASE=1) against this checkout, in one call
#      (here: moe_align folded into the router selection for chains, lingc::moe_route_align;
#      the verify graph loses its 40 align launches, the plain graph does not change).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 240 $PYT --timeout 150 --timeout-method thread tests/test_moe_experts.py \
    tests/test_moe_kernels.py tests/test_batch_invariance.py tests/test_fused_moe.py tests/test_relay.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
base_setup
BASE=1 decode_as 0 decode_base 140 lingc,lingc-nextn 48
decode_as 0 decode_head 140 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains|_moe_router_select|_moe_align|_moe_up" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
