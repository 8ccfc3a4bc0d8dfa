#!/usr/bin/env bash
# Session 39 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): the host cost of an eager lingc
# op call, split into dispatcher / checks / launch (benchmarks.host_overhead).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.host_overhead --out "$OUT/h" 2>&1 | stamp > "$OUT/host_overhead_s39_c4.log"
mv "$OUT/h/host_overhead.json" "$OUT/host_overhead_s39_c4.json"; rm -rf "$OUT/h"
cut -c9- "$OUT/host_overhead_s39_c4.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete
