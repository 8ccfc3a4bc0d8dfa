#!/usr/bin/env bash
# Session 13, call 1 on ONE H200 (only nvidia-h200 was lent; carry .whl and .triton_cache.tar.gz):
#   1. every single-GPU test file on 9d8d597 (the GPU tests have not run since 924c1ea:
#      session 12's pdl_swap probe reuse and dead-code sweep ran on the CPU only);
#   2. in a fresh process, compile + capture per role and per pass (benchmarks.compile_time,
#      Inductor off as in the decode benchmark's lingc modes) against session 11's 60.5 s;
#   3. the Triton cache entries used, packed (copy triton_cache.tar.gz over .triton_cache.tar.gz).
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m benchmarks.compile_time --preset flash-tp4-rank \
    --inductor 0 --out "$OUT" 2>&1 | stamp > "$OUT/compile_time.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
