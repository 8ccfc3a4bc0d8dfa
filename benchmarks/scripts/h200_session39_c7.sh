#!/usr/bin/env bash
# Session 39 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): the session's prefill A/Bs in one
# process with alternating order (MoE grouped-library / grouped x op calls dispatcher / direct,
# twice), a profile of a 1024-token prefill (how host-bound it is), and larger moe_grouped tiles at
# 8192 tokens.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped-library grouped --op-calls dispatcher direct dispatcher direct --profile 1024 \
    --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c7.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c7.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|host:|GPU busy|^ *[0-9.]+   [A-Za-z]" "$OUT/prefill_s39_c7.log" | cut -c9- | head -70
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_moe_grouped --tokens 8192 --block-m 64 128 \
    --block-n 64 128 --up-warps 4 8 --up-stages 3 --block-h 128 --down-warps 4 --down-stages 3 \
    --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_moe_grouped_s39_c7.log"
mv "$OUT/k/kernels_moe_grouped.json" "$OUT/kernels_moe_grouped_s39_c7.json"; rm -rf "$OUT/k"
grep -E "tokens " "$OUT/kernels_moe_grouped_s39_c7.log" | cut -c9- | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
