#!/usr/bin/env bash
# Session 55 call 4 (carry .whl; timeout_s ~200): call 3's kernel test run stopped at its 150 s cap
# before the end of test_gqa_decode.py, where the rope-table tests are: those and the PDL tests of
# both kernels alone, on CUDA.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_head_cache_write.py tests/test_gqa_decode.py -k "table or pdl or compiles" 2>&1 | stamp > "$OUT/pytest_s55_c4.log"
tail -1 "$OUT/pytest_s55_c4.log"; grep -E "FAILED|Error" "$OUT/pytest_s55_c4.log" | head -8
