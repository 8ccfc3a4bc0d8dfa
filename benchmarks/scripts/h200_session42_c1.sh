#!/usr/bin/env bash
# Session 42 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the GPU tests of session 42's
# CPU-built changes (a float16 model, graphs with symbolic shapes compiled per shape, the
# independently written MLA layer and Kimi-style model on lingc's kernels, the KDA chain's
# softplus gate, low-precision operands read as fp32), then the relay's GPU gates (the passes'
# region rule changed: products of two computed values are inside a region). Session 41's KDA
# prefill segments follow in h200_session41_c4.sh (its own call: ~10 minutes).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 $PYT tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_foreign_model.py \
    2>&1 | stamp > "$OUT/pytest_gpu_s42_c1.log"
# The kernels whose loads changed (low-precision operands read as fp32, the softplus gate; the
# GEMMs' and the router's float16 paths), their files whole: every sweep against its reference on the GPU.
CUDA_VISIBLE_DEVICES=0 timeout 260 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py tests/test_moe_kernels.py tests/test_mla_decode.py tests/test_mla_kv_write.py \
    tests/test_gemm.py tests/test_swiglu_gemm.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s42_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 110 $PYT tests/test_relay.py tests/test_batch_invariance.py \
    2>&1 | stamp >> "$OUT/pytest_gpu_s42_c1.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s42_c1.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s42_c1.log" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
