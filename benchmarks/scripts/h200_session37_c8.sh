#!/usr/bin/env bash
# Session 37 call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz): with this session's prefill
# kernels (KDA in three kernels, MLA expanded, the MoE combine), the prefill chunk 4096 (the
# default) against 8192 and 16384 in one process, and a profile of an 8192-token prefill at the
# default chunk. Expected ~100 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 8192 32768 \
    --chunk 4096 8192 16384 --profile 8192 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s37_c8.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s37_c8.json" 2>/dev/null; rm -rf "$OUT/prefill"
grep -E "^ *[0-9.]+ +[0-9]+ tokens, chunk|profiled|Error|error" "$OUT/prefill_s37_c8.log" | cut -c9-
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
