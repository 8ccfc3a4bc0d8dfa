#!/usr/bin/env bash
# Session 54 call 4 (carry .whl, .triton_cache.tar.gz; timeout_s ~360): gqa_decode's first config
# sweep (its table is untuned: 128 splits of 64 rows at 8192, of 512 at 65536; 3 stages, 8 warps
# at a Qwen3-Next rank's 256-dim heads) at both contexts, T = 1 and 6, with and without PDL.
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CFGS=()
for c in 128,64,3,8 256,64,3,8 512,64,3,8 1024,64,3,8 2048,64,3,8 64,64,3,8,256,64 128,64,2,8 256,64,4,4; do
    CFGS+=(--gqa-config "$c")
done
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.kernels_attn --no-norms --no-mla --no-gqa-layer \
    --no-inductor "${CFGS[@]}" --out "$OUT/attn" 2>&1 | stamp > "$OUT/kernels_attn_gqa_sweep_s54_c4.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_gqa_sweep_s54_c4.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "gqa_decode|FAILED|Error|fit" "$OUT/kernels_attn_gqa_sweep_s54_c4.log" | cut -c1-150 | head -60
save_triton_cache
