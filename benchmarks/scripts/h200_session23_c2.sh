#!/usr/bin/env bash
# Session 23 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file on
# the commit (session 22's last GPU run of the whole set was on bdd58fc; a2fe082's head_matmul,
# relay and batch-invariance files ran on their own; the KDA option, decode's chain bound and the
# split_rows rename came after, tested on the CPU), then a plain + relay decode with --profile
# (the chain bound's first GPU run).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests
decode_as 0 decode_table 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound|PDL-chained kernel boundary" "$OUT"/decode_table.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
