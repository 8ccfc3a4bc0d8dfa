#!/usr/bin/env bash
# Session 16 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive of
# 47b8469, the commit before the relay tail 363c97e):
#   1. KDA chain: BV x warps sweep at T=1 and T=6 (num_warps was never swept; 4 today);
#   2. MoE router: BLOCK_E x logits warps at T=1 and T=6 (T=6's logits take 4.5 us a layer);
#   3. plain decode HEAD, base, HEAD (call 1 ran base first and saw the projection GEMMs +47 us on
#      HEAD, as in session 15 call 6: is it the relay tail or the order?), SM clocks between.
set -u
source "$(dirname "$0")/device_env.sh"
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/clocks.log"; }
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda --out "$OUT/kda" --bv 4 8 16 --warps 1 2 4 8 \
    2>&1 | stamp > "$OUT/kernels_kda.log"
tail -60 "$OUT/kernels_kda.log" | grep -E "^ *[0-9.]+ \|" | head -70
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.moe_sweep --out "$OUT/moe" --set router --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
grep -E "router" "$OUT/moe_sweep.log"
base_setup
clocks; decode_as 0 plain_head1 120 lingc 48
clocks; BASE=1 decode_as 0 plain_base 120 lingc 48
clocks; decode_as 0 plain_head2 120 lingc 48
clocks
grep -E "^ *[0-9.]+ \| lingc|by kind" "$OUT"/plain_*.log
cat "$OUT/clocks.log"
for f in kda/kernels_kda.json moe/moe_sweep_flash-tp4-rank.json; do cp "$OUT/$f" "$OUT/$(basename "$f")"; done
rm -rf "$OUT/kda" "$OUT/moe"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
