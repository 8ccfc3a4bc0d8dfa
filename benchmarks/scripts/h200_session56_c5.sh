#!/usr/bin/env bash
# Session 56 call 5 (carry .whl; timeout_s ~520): after the review commit (one prepare_steps
# loop for the engines' compile-and-capture, with a reset between compile and capture): the GPU
# tests of the Ling-3 relay, speculative sampling, SpecRunner, DecodeRunner and the prefill graphs.
set -u
DURATIONS=6 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s56_c5.log"
CUDA_VISIBLE_DEVICES=0 timeout 450 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    --durations=8 tests/test_relay_sampling.py tests/test_spec_runner.py tests/test_prefill_graphs.py \
    tests/test_relay.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
