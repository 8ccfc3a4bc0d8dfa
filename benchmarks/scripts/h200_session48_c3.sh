#!/usr/bin/env bash
# Session 48, call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~380): the foreign model's GPU
# tests after the KDA probe's fix (it now keeps the best assignment: at T = 6 in bf16 a swapped
# A_log / dt_bias had come within the tolerance first), then the GPU test files call 2 did not
# reach (those after test_prefill_graphs).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s48_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED" "$LOG" | head -10
CUDA_VISIBLE_DEVICES=0 timeout "${TESTS_LIMIT:-230}" $PYT --timeout 120 --timeout-method thread \
    tests/test_prefill_graphs.py tests/test_registry.py tests/test_relay.py tests/test_relay_advance.py \
    tests/test_rmsnorm_router.py tests/test_swiglu_gemm.py tests/test_sync_probe.py tests/test_toolchain.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
save_triton_cache
