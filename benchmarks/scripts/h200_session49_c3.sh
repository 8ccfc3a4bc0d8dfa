#!/usr/bin/env bash
# Session 49 call 3 (carry .whl, .triton_cache.tar.gz; timeout_s ~240): Qwen3-Next-80B's MoE block
# on one GPU of four, lingc (softmax router, experts with the gated shared expert) against
# Transformers' batched formulation, 40 cold layers, T = 1 and 6.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_qwen3_moe --out "$OUT" 2>&1 | stamp > "$OUT/kernels_qwen3_moe.log"
tail -12 "$OUT/kernels_qwen3_moe.log"
