#!/usr/bin/env bash
# Session 43 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the GPU tests of sessions 42
# and 43's CPU-built changes. Session 43: MLA through F.scaled_dot_product_attention (the CUDA
# trace's fused op: test_pdl_swap.py::test_gpu_mla_through_sdpa), mla_decode on a float16 cache
# (test_mla_decode.py, test_backend_gpu.py's float16 model), the Kimi-style model with a batch dim
# of 1 (test_foreign_model.py::test_gpu_batched_decode_step); session 42's list follows (its
# call never ran: the device was paused). Then the relay's GPU gates (pdl_glue's clone drop now
# reads the views' current strides). Session 41's KDA prefill segments: h200_session41_c4.sh.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 $PYT tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_foreign_model.py \
    2>&1 | stamp > "$OUT/pytest_gpu_s43_c1.log"
# The kernels whose loads changed (sessions 42-43: low-precision operands read as fp32, the
# softplus gate, the GEMMs' and the router's float16 paths, mla_decode's fp16 halves), their
# files whole: every sweep against its reference on the GPU.
CUDA_VISIBLE_DEVICES=0 timeout 260 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py tests/test_moe_kernels.py tests/test_mla_decode.py tests/test_mla_kv_write.py \
    tests/test_gemm.py tests/test_swiglu_gemm.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s43_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 110 $PYT tests/test_relay.py tests/test_batch_invariance.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s43_c1.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s43_c1.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s43_c1.log" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
