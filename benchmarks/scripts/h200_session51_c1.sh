#!/usr/bin/env bash
# Session 51 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~560): this session's matcher
# forms on the GPU: Transformers' grouped_mm experts (fused_moe's GPU test; the foreign model's
# Qwen3-Next form with grouped_mm experts, bf16), fla's GatedDeltaNet at expand_v = 2 over three
# conv caches (kda_chain's SPLIT_WIN binary with V = 2K), the foreign model's other GPU tests;
# then the README table's lingc rows (plain and relay, 32 tokens) as a control: today's pass
# changes leave Ling-3's graphs as they were.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s51_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_fused_moe.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
table_modes decode_flash-tp4-rank_h100_s51_c1 lingc,lingc-nextn 300
grep -E "^\s*[0-9.]+ \| lingc|speculative|x floor|floor" "$OUT/decode_flash-tp4-rank_h100_s51_c1.log" | tail -8
save_triton_cache
