#!/usr/bin/env bash
# Session 25 call 4 on the same warm H200 right after call 3 (carry nothing new): the README
# table's second half, Inductor default and reduce-overhead + triton.enable_pdl, with their own
# copy-bandwidth measurement and floor (issue 8's "at most three calls of 8 minutes").
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 450 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --tokens 32 --modes inductor,reduce-overhead-pdl --out "$OUT/table_b" 2>&1 \
    | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
    | stamp > "$OUT/table_b.log"
cp "$OUT/table_b/decode.json" "$OUT/table_b.json"; cp "$OUT/table_b/decode.png" "$OUT/table_b.png" 2>/dev/null; rm -rf "$OUT/table_b"
grep -E "^ *[0-9.]+ \| |CUDA graphs|copy bandwidth" "$OUT/table_b.log"
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
