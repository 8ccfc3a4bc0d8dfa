#!/usr/bin/env bash
# Session 55 call 7 (carry .whl; timeout_s ~200): after the review commit (the rope tables' launch
# arguments decided in rope.py; captured_replay in the tests): the table, PDL and compile tests of
# head_cache_write / gqa_decode and mla_decode's PDL tests on CUDA.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_head_cache_write.py tests/test_gqa_decode.py tests/test_mla_decode.py -k "table or pdl" 2>&1 \
    | stamp > "$OUT/pytest_s55_c7.log"
tail -1 "$OUT/pytest_s55_c7.log"; grep -E "FAILED|Error" "$OUT/pytest_s55_c7.log" | head -8
