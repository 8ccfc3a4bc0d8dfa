#!/usr/bin/env bash
# Session 21 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split kernel at context
# 65536, where it takes 55.6 us a layer in a decode step against an 18 us floor (session 20 call
# 1): the table's config (512-row splits, 64-row tiles, 3 stages, 8 warps) against other split
# lengths, tile heights and pipeline depths, T = 1 and 6, 7 cold layers
# (`benchmarks.kernels_attn --mla-config split_len,block_l,num_stages,num_warps`).
set -u
source "$(dirname "$0")/device_env.sh"
CONFIGS=(512,64,3,8 512,64,2,8 512,32,4,8 512,32,6,8 256,64,3,8 1024,64,3,8 256,32,4,8)
ARGS=(); for c in "${CONFIGS[@]}"; do ARGS+=(--mla-config "$c"); done
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m benchmarks.kernels_attn --out "$OUT/a" \
    --no-norms --no-inductor --context 65536 --t 1 6 "${ARGS[@]}" 2>&1 | stamp > "$OUT/kernels_attn.log"
grep -E "lingc|floor" "$OUT/kernels_attn.log" | head -40
cp "$OUT/a"/*.json "$OUT/kernels_attn.json" 2>/dev/null; rm -rf "$OUT/a"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
