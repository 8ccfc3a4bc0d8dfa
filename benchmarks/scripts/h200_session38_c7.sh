#!/usr/bin/env bash
# Session 38 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): a profile of an 8192-token
# prefill with everything of this session (GPU time by kind and op), its Chrome trace kept.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 8192 --reps 1 \
    --profile 8192 --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_profile_s38_c7.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_profile_s38_c7.json"; mv "$OUT/p/prefill_trace.json.gz" "$OUT/prefill_trace_s38_c7.json.gz"
rm -rf "$OUT/p"
grep -E "profiled|^ *[0-9.]+   [A-Za-z ]+ +[0-9.]+ ms GPU" "$OUT/prefill_profile_s38_c7.log" | cut -c9- | cut -c1-400
ls -la "$OUT"
