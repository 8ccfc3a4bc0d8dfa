#!/usr/bin/env bash
# Session 66 call 1 (carry .whl; timeout_s ~560; failed starts left less device time, so the
# cheap probe first): benchmarks.expert_read_probe (does the up-GEMM's strided weight tile read
# slower than the same bytes contiguous, i.e. would a blocked expert layout pay?), then session
# 65's CPU-only relay changes on the GPU (compile_keys.for_options / compile_step, graphs_run
# reports, the no-graph-step error, benchmarks.compile_time's Dynamo reset): the GPU tests of the
# files that touch them, in one process; then the plain and relay decode at HEAD if time is left.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
timeout 120 python3 -m benchmarks.expert_read_probe --out "$OUT/erp" 2>&1 | stamp > "$OUT/expert_read_probe.log"
mv "$OUT/erp/expert_read_probe.json" "$OUT/"; rm -rf "$OUT/erp"
grep -E "^\s*\S*\s*\||copy bandwidth|Error" "$OUT/expert_read_probe.log" | head -22
DURATIONS=8 timeout 300 $PYT tests/test_relay.py tests/test_relay_sampling.py tests/test_spec_runner.py \
    tests/test_decode_runner.py tests/test_backend_gpu.py tests/test_benchmark_smoke.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
decode_as 0 decode_head 140 lingc,lingc-nextn 32
grep -E "^\S*\s*\||speculative|Error|copy bandwidth" "$OUT/decode_head.log" | head -16
ls "$OUT"
