#!/usr/bin/env bash
# Session 9, calls 2 and 3 (MODES=lingc: plain decode only), on a 2-GPU H200 host (nvidia-h200-x2): the one-token expert prefetch of the
# MoE up-GEMM, A/B in the same call.
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile) on this
#          checkout, then the MoE and PDL GPU tests;
#   GPU 1: the same decode on the baseline bd5efd2 (carried as .base.tar.gz).
# Ran at aa8b1c7 (call 2) and f995229 (call 3); both reverted since (results README, session 9).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
(decode_as 0 decode_head 230 ${MODES:-lingc,lingc-nextn} 48
 CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_moe_experts.py tests/test_fused_moe.py tests/test_moe_kernels.py \
    tests/test_pdl_trigger.py 2>&1 | stamp > "$OUT/pytest_gpu_moe.log") &
BASE=1 decode_as 1 decode_base 230 ${MODES:-lingc,lingc-nextn} 48 &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
