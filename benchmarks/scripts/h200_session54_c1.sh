#!/usr/bin/env bash
# Session 54 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~420): what session 53 left
# unverified on the GPU: the bf16 gated-attention tests after pdl_swap_gqa walks below views as
# well as casts, the GQA matcher's and its RoPE / gate forms' GPU tests; then the gated attention's
# whole step in kernels_attn (new: RoPE, cache writes, gqa_decode, gate vs eager and Inductor) and
# foreign_decode at both rank presets (with the ops left to ATen / Inductor listed).
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s54_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_pdl_swap_gqa.py tests/test_pdl_swap_gqa_rope.py tests/test_foreign_model.py tests/test_decode_runner.py \
    2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --no-norms --no-mla --out "$OUT/attn" \
    2>&1 | stamp > "$OUT/kernels_attn_gqa_s54_c1.log"
rm -rf "$OUT/attn"          # the log holds the table; eight files come back at most
grep -E "gqa|FAILED|Error" "$OUT/kernels_attn_gqa_s54_c1.log" | head -24
foreign_decode_as foreign_decode_s54_c1 kimi-linear-tp4-rank qwen3-next-tp4-rank
save_triton_cache
