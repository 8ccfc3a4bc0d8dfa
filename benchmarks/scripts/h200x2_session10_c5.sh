#!/usr/bin/env bash
# Session 10, call 5, on a 2-GPU H200 host (nvidia-h200-x2): the MoE's one-token slot layout
# (no moe_align launch at T = 1) against its baseline 3706c39 (carried as .base.tar.gz).
#   GPU 0: baseline lingc plain + relay decode;
#   GPU 1: this checkout's plain + relay decode, then the MoE, relay and backend GPU tests.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
(BASE=1 decode_as 0 decode_base 200 lingc,lingc-nextn 48) &
(decode_as 1 decode_head 200 lingc,lingc-nextn 48
 CUDA_VISIBLE_DEVICES=1 timeout 200 $PYT tests/test_moe_experts.py tests/test_moe_kernels.py tests/test_fused_moe.py \
    tests/test_relay.py tests/test_backend_gpu.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
