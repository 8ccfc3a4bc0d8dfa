#!/usr/bin/env bash
# Session 55 call 3 (carry .whl; timeout_s ~480): the rope tables (head_cache_write and gqa_decode
# reading a model's cos / sin tables) on CUDA: both kernels' test files whole (the table sweeps,
# the split out of the PDL chain above one query, the capture tests at T = 1 and 6, the sm_90
# compiles), the GQA RoPE matcher's GPU tests (the four table forms in fp32 and bf16 among them) and
# the foreign model's; then kernels_attn's GQA rows again without Inductor (the split rule's effect
# on the gated layer's whole step at T = 6).
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_head_cache_write.py tests/test_gqa_decode.py 2>&1 | stamp > "$OUT/pytest_s55_c3.log"
tail -1 "$OUT/pytest_s55_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_s55_c3.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m gpu \
    tests/test_pdl_swap_gqa_rope.py tests/test_foreign_model.py 2>&1 | stamp > "$OUT/pytest_gpu_s55_c3.log"
tail -1 "$OUT/pytest_gpu_s55_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s55_c3.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_attn --no-norms --no-mla --no-inductor \
    --out "$OUT/attn" 2>&1 | stamp > "$OUT/kernels_attn_gqa_s55_c3.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_gqa_s55_c3.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "gqa|FAILED|Error" "$OUT/kernels_attn_gqa_s55_c3.log" | cut -c1-150 | head -40
