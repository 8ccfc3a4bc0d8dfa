#!/usr/bin/env bash
# Session 44 call 1 on ONE H200 (carry .whl; no Triton cache this session): the GPU tests of
# sessions 42-44's CPU-built changes that run whole models (h200_session43_c1.sh's first and
# last groups: MLA through F.scaled_dot_product_attention, the float16 model, the Kimi-style
# model with a batch dim of 1; the relay gates and batch invariance), the KDA chain's state_vk
# GPU tests (a state stored [V, K], session 44), the gated head norm's round_steps form, and the KDA chain benchmark with its lingc-vk
# variant (the same chain on the transposed layout: sm_90 binaries of 10-12 CTA barriers a token
# against 12-14, so maybe faster).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_foreign_model.py \
    2>&1 | stamp > "$OUT/pytest_gpu_s44_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 80 $PYT tests/test_kda_kernel.py tests/test_norm_kernels.py tests/test_rmsnorm_router.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s44_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 130 $PYT tests/test_relay.py tests/test_batch_invariance.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s44_c1.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s44_c1.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s44_c1.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.kernels_kda --t 1 6 --out "$OUT/k" 2>&1 \
    | stamp > "$OUT/kernels_kda_s44_c1.log"
mv "$OUT/k/kernels_kda.json" "$OUT/kernels_kda_s44_c1.json"; rm -rf "$OUT/k"
grep -E "^ *[0-9.]+ \| [16] \|" "$OUT/kernels_kda_s44_c1.log" | cut -c9- | cut -c1-120
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
