#!/usr/bin/env bash
# Session 56 call 3 (carry .whl; timeout_s ~500): speculative sampling on the GPU: SpecRunner's
# GPU gate now with the captured verify_sample graph (seeded, greedy in the one-token nucleus
# limit, no host sync), the Ling-3 engine's sampled relay captured without a host sync, the
# prefill graphs' tests (their output now carries the last hidden row), the relay's GPU tests.
set -u
DURATIONS=6 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s56_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    --durations=8 tests/test_relay_sampling.py tests/test_spec_runner.py tests/test_prefill_graphs.py \
    tests/test_relay.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
