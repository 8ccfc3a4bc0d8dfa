#!/usr/bin/env bash
# Session 50 call 5 (carry .whl, .triton_cache.tar.gz; timeout_s ~400): the GPU tests of the pass
# files changed today (pdl_swap: the MLA / KDA matchers' new forms and rejoined_slices;
# stage_commit; fused_moe's zero-fill router; pdl_glue; the backend) and mla_decode's gpu-marked
# model-shape tests.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c5.log"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_pdl_swap.py tests/test_stage_commit.py tests/test_fused_moe.py tests/test_pdl_glue.py \
    tests/test_backend.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
