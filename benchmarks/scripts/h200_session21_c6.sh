#!/usr/bin/env bash
# Session 21 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split at 8192 with
# 64-row splits. Call 5 (Nsight Compute): at T = 1 the table's 64 programs (128-row splits) run
# on 64 of 132 SMs at one 8-warp CTA per SM (registers and shared memory both allow one), IPC
# 0.97, 8.2 cycles per issued instruction (short scoreboard 2.1, wait 1.3, long scoreboard 1.3):
# each warp's own instruction stream is the time. Halving the split doubles the programs (all
# SMs busy at T = 1) and halves each one's tile loop; the partials double.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_attn --out "$OUT/a" --no-norms --no-inductor \
    --context 8192 --t 1 6 --mla-config 64,64,2,8 --mla-config 64,64,1,8 --mla-config 64,32,2,8 \
    --mla-config 64,64,2,8,64,64 --mla-config 128,32,4,8 2>&1 | stamp > "$OUT/kernels_attn.log"
cp "$OUT/a"/*.json "$OUT/kernels_attn.json" 2>/dev/null; rm -rf "$OUT/a"
grep -E "\| lingc(-s| )" "$OUT/kernels_attn.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
