#!/usr/bin/env bash
# Session 39 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz): prefill with the model's eager
# lingc op calls direct (EagerOp) and through the dispatcher, in one process (dispatcher, direct,
# dispatcher); the GPU tests call 5's cut left (test_relay onward) and the changed benchmark test.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --op-calls dispatcher direct --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c6.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c6.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|host:" "$OUT/prefill_s39_c6.log" | cut -c9- | head -20
CUDA_VISIBLE_DEVICES=0 timeout 280 $PYT --timeout 240 --timeout-method thread tests/test_relay.py \
    tests/test_relay_advance.py tests/test_rmsnorm_router.py tests/test_stage_commit.py tests/test_swiglu_gemm.py \
    tests/test_swiglu_pass.py tests/test_symm_allreduce_pass.py tests/test_sync_probe.py tests/test_toolchain.py \
    tests/test_registry.py tests/test_benchmark_smoke.py -k "not kda_prefill_sweeps" 2>&1 | stamp > "$OUT/pytest_gpu_rest_s39_c6.log"
tail -2 "$OUT/pytest_gpu_rest_s39_c6.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_rest_s39_c6.log" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
