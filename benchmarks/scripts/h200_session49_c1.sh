#!/usr/bin/env bash
# Session 49 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~300): the relay's run-ahead
# test with each launch padded by a GPU sleep, three times alone and once beside the relay file's
# other GPU tests; the foreign model's re-bound state on CUDA (option rebound_states_in_place).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s49_c1.log"
for i in 1 2 3; do
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
        tests/test_relay.py -k "run_ahead" 2>&1 | stamp >> "$LOG"
done
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py tests/test_foreign_model.py -k "not qwen3_next_decode_step" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED" "$LOG" | head -10
save_triton_cache
