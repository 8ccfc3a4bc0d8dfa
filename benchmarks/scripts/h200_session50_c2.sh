#!/usr/bin/env bash
# Session 50 call 2 (carry .whl, .triton_cache.tar.gz; timeout_s ~560): V != K (expand_v) on the
# GPU: the KDA chain's test file whole (its unmarked kernel tests run on the GPU too; the gpu-marked
# V = 2K test at a model shape, both state layouts), the grouped-head file, the foreign model's GPU
# tests; then the relay's GPU gates (stage_commit changed: a transposition stepped over), then the
# zero-fill tie test fixed after call 1.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py tests/test_kda_grouped_heads.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 30 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_kernels.py -k "zero_fill" 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
