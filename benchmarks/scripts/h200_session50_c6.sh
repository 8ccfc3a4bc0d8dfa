#!/usr/bin/env bash
# Session 50 call 6 (carry .whl, .triton_cache.tar.gz; timeout_s ~240; run again as call 7 after the bf16 fix): the foreign model with
# Kimi Linear's math (MLA rope dims never rotated, the zero-fill grouped gate) decoding on CUDA.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c6.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py -k "kimi_linear" 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
