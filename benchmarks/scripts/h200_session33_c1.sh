#!/usr/bin/env bash
# Session 33 call 1 on ONE H200 (carry .whl; no Triton cache this checkout, so a cold JIT): every single-GPU test file's
# gpu-marked tests on the session's final code (the last whole run was session 29's call 1).
# Cold cache: run with timeout_s 600.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests 540
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
