#!/usr/bin/env bash
# Session 21 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): two MLA split programs per
# SM. Call 5 (Nsight Compute, context 8192): one 8-warp program per SM (registers and shared
# memory each allow one), IPC ~1, so a T = 6 chain's 192 programs run in two waves. Split configs
# that fit two per SM: 4 warps (64-row tiles x 2 stages: 255 registers, 32 x 3: 212, no spills in
# the sm_90 compile) and 8 warps capped at 128 registers (MlaDecodeConfig.max_registers; 8-88
# bytes of spills). Context 8192 and 65536, T = 1 and 6, against the table.
set -u
source "$(dirname "$0")/device_env.sh"
for L in 8192 65536; do
    S=$(( L == 8192 ? 128 : 512 ))
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --out "$OUT/a" --no-norms --no-inductor \
        --context $L --t 1 6 --mla-config $S,64,2,4 --mla-config $S,32,3,4 --mla-config $S,64,2,8,64,32,0,128 \
        --mla-config $S,32,3,8,64,32,0,128 2>&1 | stamp >> "$OUT/kernels_attn.log"
    cp "$OUT/a"/*.json "$OUT/kernels_attn_$L.json" 2>/dev/null; rm -rf "$OUT/a"
done
grep -E "\| lingc(-s| )" "$OUT/kernels_attn.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
