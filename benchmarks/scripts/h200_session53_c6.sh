#!/usr/bin/env bash
# Session 53 call 6 (carry .whl, .triton_cache.tar.gz; timeout_s ~240): call 5 cut to the device
# time left: the GPU tests of the output gate and of the bf16 fixes (GQA matcher, RoPE and gate
# forms, the gated-attention foreign model; gqa_decode's gate and RoPE and head_cache_write's
# kernel tests, not gpu-marked, on CUDA), then foreign_decode at qwen3-next-tp4-rank with its
# attention on lingc.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s53_c6.log"
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_pdl_swap_gqa.py tests/test_pdl_swap_gqa_rope.py tests/test_foreign_model.py -k "gqa or gated or forms" \
    2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py tests/test_head_cache_write.py -k "gate or rope or only_its_rows" 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
name=foreign_decode_s53_c6_qwen3-next
CUDA_VISIBLE_DEVICES=0 timeout 70 python3 -m benchmarks.foreign_decode --preset qwen3-next-tp4-rank \
    --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
grep -E "^\S*\s*\|| agree|bandwidth|Error" "$OUT/$name.log" | tail -6
