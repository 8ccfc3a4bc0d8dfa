#!/usr/bin/env bash
# Session 51 call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~420): the README table's lingc
# rows (plain and relay, 32 tokens) as a control after session 51's matcher changes (grouped_mm
# experts, V != K over three caches, the top-k-then-softmax router), which leave Ling-3's graphs
# as they were.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
table_modes decode_flash-tp4-rank_h100_s51_c3 lingc,lingc-nextn 400
grep -E "^\s*[0-9.]+ \| lingc|speculative|x floor|floor" "$OUT/decode_flash-tp4-rank_h100_s51_c3.log" | tail -8
