#!/usr/bin/env bash
# Session 31 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 2): the README table's
# first half again on this session's code (the router's fast picks, the down-GEMM's pair
# reads before its wait, the positions fold): eager, the eager relay, Inductor reduce-overhead and
# its relay forwards, lingc plain and relay, in one process, 32 tokens, no profiling (the table's
# command, as h200_session29_c2.sh).
# Expected ~450 s; run with timeout_s 590.
set -u
source "$(dirname "$0")/device_env.sh"
table_modes table_a eager,eager-nextn,reduce-overhead,reduce-overhead-nextn,lingc,lingc-nextn 540
grep -E "^ *[0-9.]+ \| |greedy output|CUDA graphs|copy bandwidth" "$OUT/table_a.log"
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
