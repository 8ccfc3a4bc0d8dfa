#!/usr/bin/env bash
# Session 33 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1): the README
# table's lingc rows (plain decode and the NEXTN relay) on the session's code, the table's command
# (32 tokens, no profiling).
# Expected ~150 s; run with timeout_s 300.
set -u
source "$(dirname "$0")/device_env.sh"
table_modes table_lingc lingc,lingc-nextn 240
grep -E "^ *[0-9.]+ \| |greedy|CUDA graphs|copy bandwidth|lingc" "$OUT/table_lingc.log" | tail -20
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
