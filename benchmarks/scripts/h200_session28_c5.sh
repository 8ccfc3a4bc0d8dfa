#!/usr/bin/env bash
# Session 28 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): call 4 compared the KDA chain
# from the carried Triton cache with a fresh compile on one machine. Here the whole decode step,
# plain and relay, profiled: from the carried cache, then from an empty one (every kernel compiled
# fresh in the process), one process each, same GPU.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
decode_as 0 decode_carried 150 lingc,lingc-nextn 32
mkdir -p /tmp/fresh_cache
decode_as 0 decode_fresh 300 lingc,lingc-nextn 32 TRITON_CACHE_DIR=/tmp/fresh_cache
for n in decode_carried decode_fresh; do echo "== $n"; grep -E "^ *[0-9.]+ \| lingc|greedy output|_kda_chain|compile" "$OUT/$n.log" | head -8; done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
