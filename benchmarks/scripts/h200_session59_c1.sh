#!/usr/bin/env bash
# Session 59 call 1 (carry .whl .triton_cache.tar.gz; timeout_s ~400): the engines now collect and
# freeze the heap after prepare (host_gc.py) and list the garbage collections inside a request's
# loop; both run-ahead loops are one RunAhead (run_ahead.py). The README table's lingc rows at HEAD (gc_freeze on, the default), the relay / runner GPU
# tests (their run-ahead loops changed). The table's notes give the collection that froze the heap
# (the size of a stall a full collection would cause) and the loop's median gap between rows.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
table_modes table_lingc lingc,lingc-nextn 200
grep -E "^\S*\s*\||speculative|garbage|Error" "$OUT/table_lingc.log" | head -16
LOG="$OUT/pytest_s59_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    --durations=8 tests/test_relay.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
save_triton_cache
ls "$OUT"
