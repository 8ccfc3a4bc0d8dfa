#!/usr/bin/env bash
# Session 9, call 1, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: every single-GPU test file (validates the epilogue-write change, 8ec474f, and MLA's
#          glue kernels on the "small" trigger), then Triton's cache is packed;
#   GPU 1: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile): the session's
#          baseline e421f46 (carried as .base.tar.gz), then this checkout.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
base_setup
(CUDA_VISIBLE_DEVICES=0 timeout 400 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"; save_triton_cache) &
(BASE=1 decode_as 1 decode_base 230 lingc,lingc-nextn 48
 decode_as 1 decode_head 230 lingc,lingc-nextn 48) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
