#!/usr/bin/env bash
# Session 37 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's prefill in the expanded
# form (keys and values through kv_b_proj, one fused fp32 causal SDPA per chunk) against the
# absorbed tensor-core blocks in one process; MLA's GPU tests and the prefill smoke tests first.
# Expected ~250 s. Its SDPA call had 3-d operands, which no fused kernel takes (fixed for call 5).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s37_c4.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_mla.py tests/test_benchmark_smoke.py -k "mla or prefill" 2>&1 | stamp > "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --mla expanded tensor-cores --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s37_c4.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s37_c4.json" 2>/dev/null; rm -rf "$OUT/prefill"
grep -E "^ *[0-9.]+ +[0-9]+ tokens|first token|Error|error" "$OUT/prefill_s37_c4.log" | cut -c9-
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
