#!/usr/bin/env bash
# Session 54 call 5 (carry .whl, .triton_cache.tar.gz; timeout_s ~240): after gqa_decode's
# MIN_SPLIT_LEN 64 -> 128 (call 4's sweep): its kernel tests on CUDA (the rank shapes with the
# table's config) and its kernels_attn rows (no Inductor) at the table's new config.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gqa_decode.py 2>&1 | stamp > "$OUT/pytest_s54_c5.log"
tail -1 "$OUT/pytest_s54_c5.log"; grep -E "FAILED|Error" "$OUT/pytest_s54_c5.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_attn --no-norms --no-mla --no-inductor \
    --out "$OUT/attn" 2>&1 | stamp > "$OUT/kernels_attn_gqa_s54_c5.log"
rm -rf "$OUT/attn"
grep -E "gqa|FAILED|Error" "$OUT/kernels_attn_gqa_s54_c5.log" | cut -c1-140 | head -24
