#!/usr/bin/env bash
# Session 28 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): does the KDA chain at one warp
# per program pay now? Session 16 found it faster alone (T = 6 staged 7.07 against 8.04 us) but
# level in the graph, and spilling ~250 bytes; since session 23's fused reductions the sm_90
# compile of the runtime binary at BV = 8 / one warp reports 250 registers and no spills.
#   1. kernels_kda at T = 1 and 6 with BV 2, 4, 8 at 1 and 4 warps, beside fla-core (same run);
#   2. the decode step, plain and relay, profiled: the table (BV 8, 4 warps), then BV 8 and BV 4
#      at one warp by a prelude, one process each, same GPU.
# Expected ~480 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda --t 1 6 --bv 2 4 8 --warps 1 4 \
    --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_kda.log"
cp "$OUT"/k/*.json "$OUT/kernels_kda.json"; rm -rf "$OUT/k"
grep -E "lingc \||bv.-w|fla" "$OUT/kernels_kda.log"
decode_as 0 decode_table 140 lingc,lingc-nextn 32
for bv in 8 4; do
PRELUDE="
from lingc.runtime.kernels.kda import kernel as _K
_K.CONFIGS[(8, 128, 128)] = _K.KdaConfig(bv=$bv, num_warps=1)
print('kda table:', _K.CONFIGS[(8, 128, 128)])
" decode_as 0 decode_kda_bv${bv}w1 140 lingc,lingc-nextn 32
done
for n in decode_table decode_kda_bv8w1 decode_kda_bv4w1; do echo "== $n"; grep -E "^ *[0-9.]+ \| lingc|greedy output|_kda_chain" "$OUT/$n.log" | head -8; done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
