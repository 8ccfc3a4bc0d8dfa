#!/usr/bin/env bash
# Session 37 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's prefill in the expanded
# form (keys and values through kv_b_proj, one fused fp32 causal SDPA per chunk) against the
# absorbed tensor-core blocks in one process; MLA's GPU tests and the prefill smoke tests first.
# Call 4 ran SDPA on 3-d operands (no fused kernel takes them: the math kernel ran); now 4-d. Expected ~300 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s37_c5.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_mla.py tests/test_benchmark_smoke.py -k "mla or runs_both_moe_forms" 2>&1 | stamp > "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --mla expanded tensor-cores fp32 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s37_c5.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s37_c5.json" 2>/dev/null; rm -rf "$OUT/prefill"
grep -E "^ *[0-9.]+ +[0-9]+ tokens|first token|Error|error" "$OUT/prefill_s37_c5.log" | cut -c9-
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
