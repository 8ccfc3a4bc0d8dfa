#!/usr/bin/env bash
# Session 52 call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~260): call 1 cut to what little
# device time was left after the failed starts: the GPU tests session 52's first run saw fail
# with torch 2.11's IndexError (relay gates, DecodeRunner, foreign models) and gqa_decode's.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s52_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py tests/test_pdl_swap_gqa.py tests/test_registry.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 80 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
