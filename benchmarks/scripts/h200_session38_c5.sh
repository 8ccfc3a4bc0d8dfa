#!/usr/bin/env bash
# Session 38 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA prefill state walk
# with the state in 1, 2 or 4 parts of K rows (k_split) at 4 and 8 warps, T = 8192, H = 8 and 32;
# the GPU tests of the KDA prefill kernel and its benchmark.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
for H in 8 32; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda_prefill --t 8192 --heads $H --chunk 32 \
        --bv 16 --warps-state 4 8 --k-split 1 2 4 --out "$OUT/k$H" 2>&1 | stamp > "$OUT/kda_prefill_ks_h${H}_s38_c5.log"
    mv "$OUT/k$H/kernels_kda_prefill.json" "$OUT/kda_prefill_ks_h${H}_s38_c5.json"; rm -rf "$OUT/k$H"
    grep -E "^ *[0-9.]+ \| 8192" "$OUT/kda_prefill_ks_h${H}_s38_c5.log" | cut -c9- | cut -c1-200
done
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_kda_prefill.py tests/test_benchmark_smoke.py -k "kda_prefill or flash_tp4" \
    2>&1 | stamp > "$OUT/pytest_changed_s38_c5.log"
tail -2 "$OUT/pytest_changed_s38_c5.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c5.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
