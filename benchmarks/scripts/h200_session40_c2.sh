#!/usr/bin/env bash
# Session 40 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file's
# GPU tests (session 39's last changes had not run on a GPU: kernel renames, dot_args, the EagerOp
# loop, the prefill positions record; this session's captured prefill).
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
gpu_tests 560
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
