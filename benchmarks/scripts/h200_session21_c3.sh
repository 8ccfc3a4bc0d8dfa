#!/usr/bin/env bash
# Session 21 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): compile + capture of the relay
# roles in fresh processes with a warm Triton cache (issue 7's "under 60 s" measure; session 13:
# 56.1 s), AOTAutograd's capture against the functionalised one (LingcOptions.capture).
set -u
source "$(dirname "$0")/device_env.sh"
for c in aot functionalize; do
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.compile_time --preset flash-tp4-rank \
        --inductor 0 --roles draft verify extend --capture $c --out "$OUT/ct_$c" 2>&1 | stamp > "$OUT/compile_time_$c.log"
    cp "$OUT/ct_$c/compile_time.json" "$OUT/compile_time_$c.json"; rm -rf "$OUT/ct_$c"
done
grep -E "compile|\| (draft|verify|extend) " "$OUT"/compile_time_*.log
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
