#!/usr/bin/env bash
# Session 29 call 1 on ONE H200 (carry .whl; NO .triton_cache.tar.gz: session 28 deleted the old
# carried cache, whose binaries a CUDA 13 ptxas built under keys naming Triton's 12.8). Every
# single-GPU test file's gpu-marked tests with `import lingc` pinning Triton's bundled ptxas
# (tests/test_toolchain.py's GPU test among them: a lingc kernel compiled after Inductor carries
# the PTX version of the keyed ptxas), then the cache these compiles wrote, for calls 2 and 3.
# Expected ~420 s (cold cache); run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
gpu_tests 420
grep -E "test_toolchain|test_gpu_state" "$OUT/pytest_gpu.log" | tail -4
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
