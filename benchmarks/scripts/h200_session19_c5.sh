#!/usr/bin/env bash
# Session 19 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA decode at 8192 and 65536
# with PDL on both kernels, on neither, and on one of the two (MlaDecodeConfig.split_pdl /
# combine_pdl), to find which launch loses at 65536 (call 4).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_attn --out "$OUT/a" \
    --no-norms --no-inductor --context 8192 65536 --t 1 6 2>&1 | stamp > "$OUT/kernels_attn.log"
grep -E "lingc" "$OUT/kernels_attn.log" | head -20
cp "$OUT/a"/*.json "$OUT/kernels_attn.json" 2>/dev/null; rm -rf "$OUT/a"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
