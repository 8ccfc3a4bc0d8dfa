#!/usr/bin/env bash
# Session 55 call 5 (carry .whl; timeout_s ~300): after the rope tables' launch arguments moved
# into one helper (rope.py), the CUDA table, PDL and compile tests of both kernels again; then
# whether Ling-3's MLA decode gains from the gqa_decode rule (the split out of the PDL chain above
# one query): kernels_attn's MLA rows with each kernel out of the chain, T = 1 and 6, both contexts.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_head_cache_write.py tests/test_gqa_decode.py -k "table or pdl or compiles" 2>&1 | stamp > "$OUT/pytest_s55_c5.log"
tail -1 "$OUT/pytest_s55_c5.log"; grep -E "FAILED|Error" "$OUT/pytest_s55_c5.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --no-norms --no-gqa --no-gqa-layer \
    --no-inductor --out "$OUT/attn" 2>&1 | stamp > "$OUT/kernels_attn_mla_s55_c5.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_mla_s55_c5.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "mla|FAILED|Error" "$OUT/kernels_attn_mla_s55_c5.log" | grep -v eager | cut -c1-150 | head -40
