#!/usr/bin/env bash
# Session 10, call 1, on a 2-GPU H200 host (nvidia-h200-x2): the first GPU run of design C
# (gemv_kernel.py, b89a478) and of the shared _weight_block helper (75ababc).
#   GPU 0: every single-GPU test file, then Triton's cache is packed;
#   GPU 1: the GEMM sweep (M 1 and 6) on the projection shapes of a decode step, then lingc plain
#          decode with the table as committed and with each swept shape on its best design-C
#          config (prelude_sweep_table.py), same process settings.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 420 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"; save_triton_cache) &
(gemm_sweep_as 1 220 "${DECODE_SHAPES[@]:0:4}"
 decode_as 1 decode_table 150 lingc 32
 decode_on_sweep 1 decode_c 150 lingc 32 C) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
