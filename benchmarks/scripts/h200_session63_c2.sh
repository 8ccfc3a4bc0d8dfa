#!/usr/bin/env bash
# Session 63 call 2 (warm machine, carry .whl and .triton_cache.tar.gz; timeout_s ~380): the
# relay GPU tests (captured graphs, 256-token speculative == plain, run-ahead) and SpecRunner's on
# session 62's review commit and this session's pass-note changes, and the main job's explain on
# torch 2.11 (the notes name graph inputs from Dynamo's placeholder names).
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m lingc explain --preset tiny --role verify-step 2>&1 | sed -n '/pass summary/,/^kernel table/p' | head -40
DURATIONS=8 timeout 330 $PYT tests/test_relay.py tests/test_spec_runner.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
