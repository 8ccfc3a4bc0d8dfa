#!/usr/bin/env bash
# Session 15, call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz), the budget's last minutes:
#   1. every single-GPU test file on 363c97e (the relay tails on lingc.relay_advance, the
#      verdict/emit out-variants, the ring inside the graphs; the MLA compile check);
#   2. flash-tp4-rank decode, plain and relay, 48 tokens: the relay-tail change in the step
#      (the table's figures without it: calls 1, 3 and 4 of this session).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 250 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"
decode_as 0 decode_tail 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|kernels .* nodes|by kind|greedy output" "$OUT"/decode_tail.log
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
