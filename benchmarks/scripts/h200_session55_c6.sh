#!/usr/bin/env bash
# Session 55 call 6 (carry .whl; timeout_s ~200): the foreign model's gated attention with its
# rope from Hugging Face's cos_cached tables, decoded on CUDA (T = 1 / 6, fp32 / bf16) beside the
# inv_freq form, and the GQA RoPE matcher's GPU table forms again.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m gpu \
    tests/test_foreign_model.py tests/test_pdl_swap_gqa_rope.py -k "gated_attention or table" 2>&1 \
    | stamp > "$OUT/pytest_gpu_s55_c6.log"
tail -1 "$OUT/pytest_gpu_s55_c6.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s55_c6.log" | head -8
