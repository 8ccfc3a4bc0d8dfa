#!/usr/bin/env bash
# Session 45 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1): the model-level
# GPU tests of the foreign model and pdl_swap (the Hugging Face Llama-form norms folded into the
# routers, the latent cache writes and KDA's gated output norm), then what session 44's call 3
# was to run and never did (h200_session44_c3.sh: test_gemm, test_swiglu_gemm and session 41's
# KDA prefill test file whole).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_foreign_model.py \
    tests/test_pdl_glue.py 2>&1 | stamp > "$OUT/pytest_gpu_s45_c2.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s45_c2.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s45_c2.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gemm.py tests/test_swiglu_gemm.py 2>&1 | stamp >> "$OUT/pytest_gpu_s45_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_prefill.py 2>&1 | stamp >> "$OUT/pytest_gpu_s45_c2.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s45_c2.log" | tail -2; grep -E "FAILED" "$OUT/pytest_gpu_s45_c2.log" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
