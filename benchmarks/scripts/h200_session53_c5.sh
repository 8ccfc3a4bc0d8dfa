#!/usr/bin/env bash
# Session 53 call 5 (carry .whl, .triton_cache.tar.gz; timeout_s ~300): the GQA matcher's GPU
# tests and the gated-attention foreign model's after pdl_swap_gqa took the caches below their
# casts (a bf16 SDPA's math form on CUDA upcasts them; call 4 left that attention), then
# foreign_decode at qwen3-next-tp4-rank with its attention on lingc (gqa_decode with the queries'
# RoPE and output gate, head_cache_write) against call 4's 0.206 ms (attention left to Inductor).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s53_c5.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py tests/test_pdl_swap_gqa.py tests/test_pdl_swap_gqa_rope.py tests/test_foreign_model.py \
    tests/test_mla_decode.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
name=foreign_decode_s53_c5_qwen3-next
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.foreign_decode --preset qwen3-next-tp4-rank \
    --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
grep -E "^\S*\s*\|| agree|bandwidth|Error|ops lingc left" "$OUT/$name.log" | tail -8
