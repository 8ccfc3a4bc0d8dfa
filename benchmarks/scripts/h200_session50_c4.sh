#!/usr/bin/env bash
# Session 50 call 4 (carry .whl, .triton_cache.tar.gz; timeout_s ~540): the unrotated-key test
# fixed after call 3 (its CPU comparison), then the README table's lingc rows (plain and relay,
# 32 tokens) at this session's HEAD: today's pass changes (stage_commit's step over a
# transposition, pdl_glue.rejoined_slices, the MLA and KDA matchers' new forms, the zero-fill
# router's selection kernel) leave Ling-3's graphs and speculative == plain as they were.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s50_c4.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_mla_kv_write.py -k unrotated 2>&1 | stamp > "$LOG"
tail -1 "$LOG"
table_modes decode_flash-tp4-rank_h100_s50_c4 lingc,lingc-nextn 400
grep -E "^\s*[0-9.]+ \| lingc|speculative|x floor|floor" "$OUT/decode_flash-tp4-rank_h100_s50_c4.log" | tail -8
save_triton_cache
