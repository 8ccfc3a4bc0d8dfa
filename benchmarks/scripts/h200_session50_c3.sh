#!/usr/bin/env bash
# Session 50 call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~400): MLA without a rotation on
# the GPU: mla_kv_write's and mla_decode's test files whole (their unmarked kernel tests run on
# the GPU: the unrotated key, a zero-width key, P = 0 attention), the grouped-head carry check
# (its own Triton cache now), the foreign model's GPU tests; then the relay's GPU gates (pdl_swap's
# glue gained rejoined_slices, the MLA matcher its P = 0 and unrotated forms).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_mla_kv_write.py tests/test_mla_decode.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_grouped_heads.py -k carries 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
