#!/usr/bin/env bash
# Session 39 call 10 on ONE H200 (carry .whl, .triton_cache.tar.gz): the new GPU tests (EagerOp on
# CUDA tensors, the smoke tests of benchmarks.kernels_moe_grouped and benchmarks.host_overhead).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_registry.py tests/test_benchmark_smoke.py \
    -k "registry or dispatcher or moe_grouped or host_overhead" 2>&1 | stamp > "$OUT/pytest_new_s39_c10.log"
tail -2 "$OUT/pytest_new_s39_c10.log"; grep -E "FAILED|Error" "$OUT/pytest_new_s39_c10.log" | head
