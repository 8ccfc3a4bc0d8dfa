#!/usr/bin/env bash
# Session 54 call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~450): the README table's lingc
# rows (plain and relay, 32 tokens) as a control after session 54's kda_chain change (its
# per-token inputs addressed as head-grouped views: an integer divide and modulo a program,
# before the token loop), which Ling-3's 35 KDA layers run every step.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
table_modes decode_flash-tp4-rank_s54_c3 lingc,lingc-nextn 420
grep -E "^\s*[0-9.]+ \| lingc|speculative|x floor|floor" "$OUT/decode_flash-tp4-rank_s54_c3.log" | tail -8
save_triton_cache
