#!/usr/bin/env bash
# Session 66 call 3 (carry .whl; timeout_s ~170; ~220 s of device time left, machine warm): the
# other files session 65's CPU-only changes touch: SpecRunner / DecodeRunner reports, the backend.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=8 timeout 140 $PYT tests/test_spec_runner.py tests/test_decode_runner.py tests/test_backend_gpu.py 2>&1 \
    | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "PASSED|FAILED|Error" "$OUT/pytest_gpu.log" | head -30
