#!/usr/bin/env bash
# Session 66 call 2 (carry .whl; timeout_s ~200; ~350 s of device time left): session 65's
# CPU-only relay changes on the GPU (compile_keys.for_options / compile_step, RelayDriver.reports,
# the no-graph-step error): test_relay.py's then test_relay_sampling.py's GPU tests in one process
# (session 65 call 4's order, which a second engine's reused graphs once failed).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=8 timeout 170 $PYT tests/test_relay.py tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
