#!/usr/bin/env bash
# Session 32 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file's
# gpu-marked tests on 3f08cca's code (the last whole run was session 24's), with durations.
# Expected ~450 s; run with timeout_s 590.
set -u
DURATIONS=25 source "$(dirname "$0")/device_env.sh"
gpu_tests 520
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
