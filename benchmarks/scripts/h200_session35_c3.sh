#!/usr/bin/env bash
# Session 35 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): prefill with the 2048-token
# default chunk and MLA's per-block cache bound, at 1024 and 8192 tokens, chunks 2048 and 4096
# (grouped MoE); a profile of a 4096-token prefill at 2048; the relay's and the model's gpu tests
# (prefill changed under them).
# Expected ~300 s; run with timeout_s 500.
set -u
source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s35_c3.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_relay.py tests/test_moe.py tests/test_benchmark_smoke.py \
    tests/test_reference_decoding.py tests/test_decode_checkpoint.py 2>&1 | stamp > "$LOG"
tail -3 "$LOG"; grep -E "FAILED|Error" "$LOG" | head
CUDA_VISIBLE_DEVICES=0 timeout 280 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 \
    --moe grouped --chunk 2048 4096 --profile 4096 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c3.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c3.json" 2>/dev/null
mv "$OUT/prefill/prefill_trace.json.gz" "$OUT/prefill_trace_s35_c3.json.gz" 2>/dev/null; rmdir "$OUT/prefill" 2>/dev/null
grep -E "tokens, chunk|profiled|^ *[0-9.]+ \|" "$OUT/prefill_s35_c3.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
