#!/usr/bin/env bash
# Session 51 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~420; written in session 51, which
# was lent no device: run it in the next session). This session's CPU-built work on the GPU:
# Transformers' grouped_mm experts (fused_moe's GPU test; the foreign model's Qwen3-Next form with
# grouped_mm experts, bf16), fla's GatedDeltaNet at expand_v = 2 over three conv caches
# (kda_chain's SPLIT_WIN binary with V = 2K), lingc.DecodeRunner's captured step (the foreign
# models' greedy tokens against eager on the GPU, its PDL edges), the relay's GPU gates (Engine's
# host loop copies its ring through buffers.copy_row_to_host now).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s51_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_fused_moe.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
# The relay's GPU gates: Engine's host loop now copies the ring through buffers.copy_row_to_host.
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
save_triton_cache
