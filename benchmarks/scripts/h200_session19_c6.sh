#!/usr/bin/env bash
# Session 19 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz): the MLA decode GPU tests with
# the split out of the PDL chain at long contexts (config_for's split_pdl), and the chains with
# PDL on one kernel only.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 120 --timeout-method thread tests/test_mla_decode.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error|assert" "$OUT/pytest_gpu.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
