#!/usr/bin/env bash
# Session 52 call 1 (carry .whl, .triton_cache.tar.gz; timeout_s ~560): session 51's GPU tests
# again after the torch 2.11 version-bump fix (runtime/registry.py + lingc/compat.py: every
# kda_chain left at k_window = None raised IndexError in session 52's first run), and the new
# gqa_decode kernel's GPU tests (rank shapes at 8192 / 65536, PDL chain under capture), then
# gqa_decode's first timing (kernels_attn, gqa only; call 2 has it too, with foreign_decode).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s52_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py tests/test_pdl_swap_gqa.py tests/test_registry.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_fused_moe.py tests/test_decode_runner.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --no-norms --no-mla --out "$OUT/attn" \
    2>&1 | stamp > "$OUT/kernels_attn_gqa_s52_c1.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_gqa_s52_c1.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "gqa_decode|FAILED|Error" "$OUT/kernels_attn_gqa_s52_c1.log" | head -20
save_triton_cache
