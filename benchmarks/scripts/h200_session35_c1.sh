#!/usr/bin/env bash
# Session 35 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the MoE's grouped form for
# prefill chunks and last_logits_only. GPU tests of the changed files (test_moe whole, the
# prefill benchmark's smoke test, test_model, the relay's gpu gates: their prefill changed), then
# benchmarks.prefill at 1024 and 8192 tokens, grouped against gather in the same process.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s35_c1.log
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -p no:cacheprovider -q --tb=short --durations=5 \
    tests/test_moe.py tests/test_model.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_benchmark_smoke.py -k prefill tests/test_relay.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 \
    --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c1.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c1.json" 2>/dev/null; rmdir "$OUT/prefill" 2>/dev/null
tail -12 "$OUT/prefill_s35_c1.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
