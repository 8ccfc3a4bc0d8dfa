#!/usr/bin/env bash
# Session 9, call 4, on a 2-GPU H200 host (nvidia-h200-x2): KDA's gated head norm folded into
# its o_proj GEMM (lingc::gemm_head_norm), A/B in the same call, then every single-GPU test file
# of this checkout, split over the two GPUs.
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile) on this
#          checkout, then the test files test_[a-k]*;
#   GPU 1: the same decode on the baseline bd5efd2 (carried as .base.tar.gz), then the others.
# Ran at ba5c2b6; the head-norm fold was reverted since (results README, session 9).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
files() { ls tests/test_*.py | grep -v test_tensor_parallel.py | grep "$1"; }
(decode_as 0 decode_head 230 lingc,lingc-nextn 48
 CUDA_VISIBLE_DEVICES=0 timeout 260 $PYT --timeout 200 --timeout-method thread $(files '/test_[a-k]') 2>&1 \
    | stamp > "$OUT/pytest_gpu_a-k.log") &
(BASE=1 decode_as 1 decode_base 230 lingc,lingc-nextn 48
 CUDA_VISIBLE_DEVICES=1 timeout 260 $PYT --timeout 200 --timeout-method thread $(files '/test_[l-z]') 2>&1 \
    | stamp > "$OUT/pytest_gpu_l-z.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
