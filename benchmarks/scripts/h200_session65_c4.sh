#!/usr/bin/env bash
# Session 65 call 4 (carry .whl; timeout_s ~330). Call 2 (h200_session65_c2.sh, an H100) ran the
# GPU suite up to tests/test_pdl_swap_gqa_rope.py (401 passed); call 3 ran the rest at 600c527
# (`$PYT --timeout 240 --timeout-method thread` over the files from test_pdl_swap_gqa_rope.py on):
# 118 passed, 1 failed: the sampled relay's no-sync test, whose engine reused the graphs an earlier
# engine compiled (test_relay.py's, same model shape and options) and so ran the naive per-step
# refill. Here, with the fix (graphs_run), test_relay.py's GPU tests then test_relay_sampling.py's
# in one process, the order that failed.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=8 timeout 300 $PYT tests/test_relay.py tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
