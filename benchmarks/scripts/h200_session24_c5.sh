#!/usr/bin/env bash
# Session 24 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): the kernel test files IN FULL
# on the GPU (not only their gpu-marked tests: call 4 found an unmarked mla_kv_write test that
# had never run on a GPU and failed there), smallest first, until the call's time is spent;
# each file's summary line and every failure go to $OUT/pytest_full.log.
set -u
source "$(dirname "$0")/device_env.sh"
deadline=$((SECONDS + ${BUDGET:-300}))
# FILES (test file stems, in order) overrides the list, e.g. session 25's remainder:
#   BUDGET=300 FILES="norm_kernels mla_decode kda_kernel swiglu_gemm gemm moe_kernels moe_experts"
for f in ${FILES:-mla_kv_write relay_advance greedy_verdict head_matmul rmsnorm_router concat_cols norm_kernels \
         mla_decode kda_kernel swiglu_gemm gemm moe_kernels moe_experts}; do
    left=$((deadline - SECONDS)); [ "$left" -lt 20 ] && { echo "tests/test_$f.py: not run (time)"; continue; }
    CUDA_VISIBLE_DEVICES=0 timeout "$left" python3 -m pytest -p no:cacheprovider -q --tb=short \
        --timeout 120 --timeout-method thread "tests/test_$f.py" > "/tmp/t_$f.log" 2>&1
    echo "tests/test_$f.py (rc $?): $(grep -E '(passed|failed|error)' /tmp/t_$f.log | tail -1)"
    grep -E "^(FAILED|ERROR)" "/tmp/t_$f.log"
done 2>&1 | stamp | tee "$OUT/pytest_full.log"
for f in /tmp/t_*.log; do grep -q -E "^(FAILED|ERROR)" "$f" && cp "$f" "$OUT/"; done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
