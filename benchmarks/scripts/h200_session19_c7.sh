#!/usr/bin/env bash
# Session 19 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): moe_align folded into the
# router selection (lingc::moe_route_align) on the GPU: its kernel tests on CUDA (the unmarked
# ones run on the GPU when one is present), the captured router -> experts chain, and the relay's
# speculative == plain gate over 256 tokens (the verify graph takes the fused align).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -p no:cacheprovider --tb=short -q --timeout 120 \
    --timeout-method thread tests/test_moe_kernels.py tests/test_moe_experts.py tests/test_relay.py \
    -k "fused_align or route_align or align_layout or speculative_equals_plain_256" 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -5 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
