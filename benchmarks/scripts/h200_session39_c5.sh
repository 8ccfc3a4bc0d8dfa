#!/usr/bin/env bash
# Session 39 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): lingc ops skip the custom-op
# dispatcher in plain eager CUDA code (EagerOp). The host costs again (model column), prefill with
# the host report, then every single-GPU test file's GPU tests.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.host_overhead --out "$OUT/h" 2>&1 | stamp > "$OUT/host_overhead_s39_c5.log"
rm -rf "$OUT/h"; cut -c9- "$OUT/host_overhead_s39_c5.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c5.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c5.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|host:" "$OUT/prefill_s39_c5.log" | cut -c9- | head -20
gpu_tests 330
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
mv "$OUT/pytest_gpu.log" "$OUT/pytest_gpu_s39_c5.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
