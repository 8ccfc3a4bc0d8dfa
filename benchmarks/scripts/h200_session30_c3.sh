#!/usr/bin/env bash
# Session 30 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the session's final code (the
# router's fast picks; the down-GEMM's pairs before its wait; the up-GEMM as before): the GPU
# tests of the router, the MoE and the relay gates (call 2 cut the bf16 256-token gate), then one
# decode run (flash-tp4-rank, context 8192, lingc plain and relay, --profile, 32 tokens).
# Expected ~220 s; run with timeout_s 250.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 130 $PYT tests/test_moe_kernels.py tests/test_rmsnorm_router.py tests/test_fused_moe.py \
    tests/test_moe_experts.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_moe.log"
tail -2 "$OUT/pytest_gpu_moe.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_moe.log" | head
decode_as 0 decode_final 100 lingc,lingc-nextn 32
grep -E "^ *[0-9.]+ \| lingc|greedy" "$OUT/decode_final.log" | tail -3
rm -f "$OUT/install.log"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
