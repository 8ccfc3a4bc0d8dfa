#!/usr/bin/env bash
# Session 37 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1; the untracked
# baseline_kda_prefill_kernel.py = 0e2ea1e's kernel.py): the KDA prefill kernels at the new table
# (tf32x3, chunk 32, BV 16, 4 warps in the chunk pass, 8 in the state walk): their GPU tests and the
# prefill smoke test; the sweep at H = 32 (flash unsharded) and a 16-warp state walk at H = 8; then
# benchmarks.prefill's TTFT. Expected ~450 s; run with timeout_s 590.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s37_c2.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_kda_prefill.py tests/test_benchmark_smoke.py -k "prefill" 2>&1 | stamp > "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_kda_prefill --t 8192 --chunk 32 --bv 16 \
    --bv-out 64 --warps-out 4 --warps-chunk 4 --warps-state 8 16 --precision tf32x3 --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_s37_c2.log"
grep -E "\| 8192 \|" "$OUT/kda_prefill_s37_c2.log" | cut -c9-
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_s37_c2.json" 2>/dev/null; rm -rf "$OUT/k"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda_prefill --t 8192 --heads 32 --chunk 32 --bv 16 32 \
    --bv-out 64 --warps-out 4 --warps-chunk 4 --warps-state 4 8 --precision tf32x3 \
    --baseline benchmarks/scripts/baseline_kda_prefill_kernel.py --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_h32_s37_c2.log"
grep -E "\| 8192 \|" "$OUT/kda_prefill_h32_s37_c2.log" | cut -c9-
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_h32_s37_c2.json" 2>/dev/null; rm -rf "$OUT/k"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s37_c2.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s37_c2.json" 2>/dev/null; rm -rf "$OUT/prefill"
tail -8 "$OUT/prefill_s37_c2.log"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
