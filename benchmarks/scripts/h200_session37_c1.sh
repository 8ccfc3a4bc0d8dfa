#!/usr/bin/env bash
# Session 37 call 1 on ONE H200 (carry .whl; the untracked benchmarks/scripts/baseline_kda_prefill_kernel.py
# = 0e2ea1e's kernel.py travels as an untracked file): the KDA prefill smoke test, then the sweep on
# tf32x3 at chunk 32 (session 36: every ieee config and every chunk-64 config is slower) over BV and the
# chunk pass's and the state walk's warps, the per-kernel split timed without PDL; the Triton cache
# packed for the next call. Expected ~300 s cold.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_benchmark_smoke.py -k "kda_prefill" 2>&1 | stamp > "$OUT/pytest_changed_s37_c1.log"
tail -1 "$OUT/pytest_changed_s37_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 380 python3 -m benchmarks.kernels_kda_prefill --t 8192 --chunk 32 --bv 16 32 \
    --bv-out 64 --warps-out 4 --warps-chunk 4 8 --warps-state 4 8 --precision tf32x3 \
    --baseline benchmarks/scripts/baseline_kda_prefill_kernel.py --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_s37_c1.log"
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_s37_c1.json" 2>/dev/null; rm -rf "$OUT/k"
grep -E "\| 8192 \|" "$OUT/kda_prefill_s37_c1.log" | cut -c9- | sort -t'|' -k4 -n | head -24
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
