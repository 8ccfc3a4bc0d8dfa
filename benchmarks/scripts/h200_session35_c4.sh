#!/usr/bin/env bash
# Session 35 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): prefill at the final defaults
# (4096-token chunks, the grouped MoE, MLA's per-block cache bound) at 1024, 8192 and 32768
# tokens; the 1024-token prompt also in the gather form at 256-token chunks (the code before
# this session, but for MLA's blocks and the last-row logits).
# Expected ~250 s; run with timeout_s 480.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c4.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c4.json" 2>/dev/null
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 \
    --moe gather --chunk 256 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c4_before.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c4_before.json" 2>/dev/null; rmdir "$OUT/prefill" 2>/dev/null
grep -E "tokens, chunk|^ *[0-9.]+ \|" "$OUT"/prefill_s35_c4*.log | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
