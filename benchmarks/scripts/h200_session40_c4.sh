#!/usr/bin/env bash
# Session 40 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA prefill kernel at short
# prompts (T = 1024, 2048; H = 8), where a captured 1024-token prefill spends ~11.6 of ~29 ms in it:
# chunk 16 / 32 / 64 x state walk in 1 / 2 / 4 K parts x 4 / 8 walk warps, FLA beside.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m benchmarks.kernels_kda_prefill --t 1024 2048 --heads 8 \
    --chunk 16 32 64 --bv 16 --k-split 1 2 4 --warps-state 4 8 --warps-chunk 4 --reps 20 --warmup 3 \
    --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_short_s40_c4.log"
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_short_s40_c4.json"; rm -rf "$OUT/k"
grep -E "^ *[0-9.]+ \|" "$OUT/kda_prefill_short_s40_c4.log" | cut -c9- | head -60
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
