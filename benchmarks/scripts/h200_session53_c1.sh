#!/usr/bin/env bash
# Session 53 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~560): the GPU tests session 52
# could not run (its torch 2.11 version-bump fix: relay gates, DecodeRunner, foreign models;
# gqa_decode and its matcher) and session 53's: head_cache_write, gqa_decode's query RoPE, the
# per-head cache writes and RoPE folds (tests/test_pdl_swap_gqa_rope.py).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s53_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_head_cache_write.py tests/test_gqa_decode.py tests/test_pdl_swap_gqa.py tests/test_pdl_swap_gqa_rope.py \
    tests/test_registry.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_fused_moe.py tests/test_decode_runner.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
save_triton_cache
