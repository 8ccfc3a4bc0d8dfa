#!/usr/bin/env bash
# Session 29 call 3 on the same warm H200 right after call 2: the README table's second half on the
# pinned toolchain (Inductor default, reduce-overhead + triton.enable_pdl; as h200_session25_c4.sh),
# then kernels_kda (the attention issue's KDA target: session 28 call 4 measured the 12.8 binary at
# 1.53x fla-core, the CUDA 13 one at 1.27-1.31x).
# Expected ~360 s; run with timeout_s 590.
set -u
source "$(dirname "$0")/device_env.sh"
table_modes table_b inductor,reduce-overhead-pdl 450
grep -E "^ *[0-9.]+ \| |CUDA graphs|copy bandwidth" "$OUT/table_b.log"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_kda --t 1 6 --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_kda.log"
cp "$OUT"/k/*.json "$OUT/kernels_kda.json"; rm -rf "$OUT/k"; grep -E "\| lingc \||fla" "$OUT/kernels_kda.log"
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
