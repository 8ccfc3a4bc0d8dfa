#!/usr/bin/env bash
# Prepared at the end of session 15 for the next session's first call on ONE H200 (carry .whl,
# .triton_cache.tar.gz if there is one, and .base.tar.gz = `git archive --format=tar.gz -o
# .base.tar.gz 683b59c`):
#   1. every single-GPU test file on this checkout: c2fbbf6's lingc.embedding_rmsnorm (the token
#      embedding gather inside the first RMSNorm) has run only under the Triton interpreter;
#   2. the decode A/B of that change in one call: 683b59c (the base, BASE=1) against this
#      checkout, plain and relay, 48 tokens each.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"
base_setup
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 48
decode_as 0 decode_embed 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|kernels .* nodes|greedy output" "$OUT"/decode_*.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
