#!/usr/bin/env bash
# Session 50 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~300): the zero-fill router
# (DeepSeek-V3's group mask, moe_router(..., zero_fill=True)) on the GPU: the router and align
# test file whole (its unmarked kernel tests run on the GPU too; the Ling-3-shape zero-fill test
# is gpu-marked), then fused_moe's tests (they compile on the CPU path and check the GPU's none).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_kernels.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q -rA \
    tests/test_moe_kernels.py -k "zero_fill" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
