#!/usr/bin/env bash
# Session 34 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): the relay depth sweep of the
# README (`--steps 3 4 5 6 7`: draft tokens 4..8) on the current code, the table's settings
# (flash-tp4-rank, context 8192, 32 tokens, lingc without Inductor), in one run.
# Expected ~420 s; run with timeout_s 560.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 520 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --tokens 32 --modes lingc-nextn --steps 3 4 5 6 7 --out "$OUT/depth" 2>&1 \
    | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
    | stamp > "$OUT/depth_sweep_s34_c2.log"
cp "$OUT/depth/decode.json" "$OUT/depth_sweep_s34_c2.json"; cp "$OUT/depth/decode.png" "$OUT/depth_sweep_s34_c2.png" 2>/dev/null
rm -rf "$OUT/depth"
grep -E "^ *[0-9.]+ \| |greedy|copy bandwidth" "$OUT/depth_sweep_s34_c2.log" | tail -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
