#!/usr/bin/env bash
# Session 32 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file's
# gpu-marked tests on the session's final code (the last whole run was session 29's call 1).
# Expected ~330 s; run with timeout_s 480.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests 420
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
