#!/usr/bin/env bash
# Session 18 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz, and .base.tar.gz = `git archive
# --format=tar.gz -o .base.tar.gz 6f0d8ec`, the code call 1 measured as its head):
#   1. every single-GPU test file on this checkout;
#   2. decode, plain + relay (--profile): 6f0d8ec (BASE=1) against this checkout, in one call
#      (here: the MoE down-GEMM's 128-column tiles, moe_align in one warp).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 240 --timeout-method thread tests/ \
    --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
base_setup
BASE=1 decode_as 0 decode_base 140 lingc,lingc-nextn 48
decode_as 0 decode_head 140 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains|_moe_align|_moe_down" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
