#!/usr/bin/env bash
# Session 50 call 8 (carry .whl, .triton_cache.tar.gz; timeout_s ~260): three conv caches
# (fla's layers: kda_chain's k_window / v_window, SPLIT_WIN) on the GPU: the kernel tests of the
# split caches and V != K, the foreign three-cache layer compiled on CUDA.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c8.log"
CUDA_VISIBLE_DEVICES=0 timeout 70 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py -k "three_caches" 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py -k "three_conv" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
