#!/usr/bin/env bash
# Session 19 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA decode at context 65536,
# PDL on and off, under the default trigger placement (small: MLA's combine releases the next
# kernel before its own wait) and under LINGC_PDL_TRIGGER=late. Session 18 saw PDL lose at 65536
# (T = 1: 45.0 against 38.2 us) and win at 8192; this asks whether the early trigger is why.
set -u
source "$(dirname "$0")/device_env.sh"
for trig in small late; do
    LINGC_PDL_TRIGGER=$trig CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --out "$OUT/a_$trig" \
        --no-norms --no-inductor --context 65536 --t 1 6 2>&1 | stamp > "$OUT/kernels_attn_$trig.log"
    grep -E "lingc" "$OUT/kernels_attn_$trig.log" | head -12
    cp "$OUT/a_$trig"/*.json "$OUT/kernels_attn_$trig.json" 2>/dev/null; rm -rf "$OUT/a_$trig"
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
