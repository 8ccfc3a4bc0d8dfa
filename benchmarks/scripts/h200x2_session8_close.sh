#!/usr/bin/env bash
# Session 8, closing call, on a 2-GPU H200 host (nvidia-h200-x2): flash-tp4-rank decode (context
# 8192, lingc plain and relay, --profile), the two PDL trigger placements side by side:
#   GPU 0: LINGC_PDL_TRIGGER=small;   GPU 1: LINGC_PDL_TRIGGER=late.
set -u
source "$(dirname "$0")/device_env.sh"
for g in 0 1; do
    t=$([ $g = 0 ] && echo small || echo late)
    (LINGC_PDL_TRIGGER=$t CUDA_VISIBLE_DEVICES=$g timeout 230 python3 -m benchmarks.decode --preset flash-tp4-rank \
        --context 8192 --lingc-inductor 0 --modes lingc,lingc-nextn --tokens 48 --profile --out "$OUT/$t" 2>&1 \
        | stamp > "$OUT/decode_$t.log"; cp "$OUT/$t/decode.json" "$OUT/decode_$t.json"; rm -rf "$OUT/$t") &
done
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
