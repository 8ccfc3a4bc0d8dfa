#!/usr/bin/env bash
# Session 63 call 2 (carry .whl and .triton_cache.tar.gz; timeout_s ~340; what device budget is
# left after call 1): on an H200 the README table's lingc rows at HEAD (none lent since session
# 45); on an H100 the relay GPU tests (captured graphs, 256-token speculative == plain, run-ahead)
# and SpecRunner's on session 62's review commit; either way the main job's explain on torch 2.11
# (the pass notes name graph inputs from Dynamo's placeholder names).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
python3 -m lingc explain --preset tiny --role verify-step 2>&1 | sed -n '/pass summary/,/^kernel table/p' | head -24
if [[ "$GPU" == *H200* ]]; then
    table_modes table_lingc lingc,lingc-nextn 270
    grep -E "^\S*\s*\||speculative|Error|copy bandwidth" "$OUT/table_lingc.log" | head -16
else
    DURATIONS=8 timeout 260 $PYT tests/test_relay.py tests/test_spec_runner.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
    grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
    grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
fi
