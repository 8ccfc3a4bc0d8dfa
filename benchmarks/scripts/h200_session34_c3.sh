#!/usr/bin/env bash
# Session 34 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the README table's lingc rows
# (plain decode and the NEXTN relay, 32 tokens, no profiling) at longer contexts: 32768, 65536
# and 131072 cache rows before the first decoded token (the table's 8192 is session 33's).
# Expected ~3 x 90 s; run with timeout_s 560.
set -u
source "$(dirname "$0")/device_env.sh"
for ctx in 32768 65536 131072; do
    CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.decode --preset flash-tp4-rank --context $ctx \
        --lingc-inductor 0 --tokens 32 --modes lingc,lingc-nextn --out "$OUT/c$ctx" 2>&1 \
        | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
        | stamp > "$OUT/context_${ctx}_s34_c3.log"
    cp "$OUT/c$ctx/decode.json" "$OUT/context_${ctx}_s34_c3.json"; rm -rf "$OUT/c$ctx"
    grep -E "^ *[0-9.]+ \| lingc|greedy|copy bandwidth" "$OUT/context_${ctx}_s34_c3.log" | tail -4
done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
