#!/usr/bin/env bash
# Session 53 call 4 (carry .whl, .triton_cache.tar.gz; timeout_s ~300): call 1's bf16 failures
# again after lingc/sdpa.py's cuDNN stand-in learned GQA (SDPA with enable_gqa traces to cuDNN's op
# in bf16 on an H100, with the key / value heads as they are), then foreign_decode at
# qwen3-next-tp4-rank (gated attention on gqa_decode, head_cache_write, the RoPE folds).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s53_c4.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_pdl_swap_gqa.py tests/test_pdl_swap_gqa_rope.py tests/test_sdpa.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py -k "gated or qwen3" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
name=foreign_decode_s53_c4_qwen3-next
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.foreign_decode --preset qwen3-next-tp4-rank \
    --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
grep -E "^\S*\s*\|| agree|bandwidth|Error" "$OUT/$name.log" | tail -6
