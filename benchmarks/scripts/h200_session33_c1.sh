#!/usr/bin/env bash
# Session 33 call 1 on ONE H200 (carry .whl; this checkout has no Triton cache, so a cold JIT):
# every single-GPU test file's gpu-marked tests on the session's code (the last whole run was
# session 29's call 1), then the README table's lingc rows (plain and relay, the table's command:
# 32 tokens, no profiling) on the warm cache the tests left.
# Expected ~300 + ~150 s; run with timeout_s 600.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests 390
table_modes table_lingc lingc,lingc-nextn 170
grep -E "^ *[0-9.]+ \| |greedy output|CUDA graphs|copy bandwidth" "$OUT/table_lingc.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
