#!/usr/bin/env bash
# Session 35 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): prefill at 8192 tokens with
# the grouped MoE at chunks 256 / 1024 / 2048 (MLA now attends 256 queries at a time), and a
# torch.profiler run of a 1024-token prefill at chunk 256 (where KDA's 1.5 ms per chunk goes).
# Expected ~200 s; run with timeout_s 420.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 360 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 8192 \
    --moe grouped --chunk 256 1024 2048 --profile 1024 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c2.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c2.json" 2>/dev/null
mv "$OUT/prefill/prefill_trace.json.gz" "$OUT/prefill_trace_s35_c2.json.gz" 2>/dev/null; rmdir "$OUT/prefill" 2>/dev/null
grep -E "tokens, chunk|profiled|^ *[0-9.]+ \|" "$OUT/prefill_s35_c2.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
