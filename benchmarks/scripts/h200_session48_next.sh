#!/usr/bin/env bash
# For the next session (carry .whl, .triton_cache.tar.gz; timeout_s ~500): session 48's
# CPU-built GPU paths first (the softmax router's selection kernel; the foreign model with the
# option rebound_states_in_place; the batched_mm / softmax MoE forms run on the same kernels),
# then the relay's run-ahead test alone (94.8% once under the whole run, passed alone), then
# every single-GPU test file's GPU tests in the time left.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s48_next.log"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_kernels.py -k "softmax or router" 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py tests/test_relay.py -k "qwen3 or decode_step or three_graphs" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED" "$LOG" | head -10
gpu_tests "${TESTS_LIMIT:-250}"
save_triton_cache
