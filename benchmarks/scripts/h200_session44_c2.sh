#!/usr/bin/env bash
# Session 44 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1): the kernel test
# files whose loads changed in sessions 42-43 (low-precision operands read as fp32, the softplus
# gate, the GEMMs' and the router's float16 paths, mla_decode's fp16 halves), each whole: every
# sweep against its reference on the GPU; then session 41's KDA prefill segments (its test file
# whole and the benchmark's smoke test; the measurement is h200_session41_c4.sh).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_kernels.py tests/test_mla_decode.py tests/test_mla_kv_write.py tests/test_gemm.py \
    tests/test_swiglu_gemm.py 2>&1 | stamp > "$OUT/pytest_kernels_s44_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_prefill.py 2>&1 | stamp >> "$OUT/pytest_kernels_s44_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 $PYT tests/test_benchmark_smoke.py -k kda_prefill 2>&1 | stamp >> "$OUT/pytest_kernels_s44_c2.log"
grep -E "passed|failed" "$OUT/pytest_kernels_s44_c2.log"; grep -E "FAILED|Error" "$OUT/pytest_kernels_s44_c2.log" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
