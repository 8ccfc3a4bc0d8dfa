#!/usr/bin/env bash
# Session 55 call 2 (carry .whl; timeout_s ~360): gqa_decode's per-kernel PDL switches
# (GqaDecodeConfig.split_pdl / combine_pdl, as MLA's): its kernel tests on CUDA (the new
# one-kernel-out-of-the-chain capture test among them), then kernels_attn's GQA rows with the
# lingc-split-no-pdl / lingc-combine-no-pdl variants and the gated layer's whole step, now with
# Qwen3-Next's q / k norms (folded into gqa_decode's query load and head_cache_write), against
# eager and Inductor.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py 2>&1 | stamp > "$OUT/pytest_s55_c2.log"
tail -1 "$OUT/pytest_s55_c2.log"; grep -E "FAILED|Error" "$OUT/pytest_s55_c2.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 220 python3 -m benchmarks.kernels_attn --no-norms --no-mla \
    --out "$OUT/attn" 2>&1 | stamp > "$OUT/kernels_attn_gqa_s55_c2.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_gqa_s55_c2.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "gqa|FAILED|Error" "$OUT/kernels_attn_gqa_s55_c2.log" | cut -c1-150 | head -40
