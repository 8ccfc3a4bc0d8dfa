#!/usr/bin/env bash
# Session 13, call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): every single-GPU test file
# on the session's last code commit (argmax slots, KDA state before the wait, recompile watch).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
