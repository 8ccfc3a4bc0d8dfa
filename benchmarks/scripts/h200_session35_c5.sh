#!/usr/bin/env bash
# Session 35 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's prefill blocks on bf16
# tensor cores (hi/lo halves) against the fp32 einsums, at 8192 and 32768 tokens in one process;
# test_mla's gpu tests (the tensor-core blocks against fp32).
# Expected ~200 s; run with timeout_s 420.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 $PYT tests/test_mla.py tests/test_moe.py 2>&1 | stamp > "$OUT/pytest_changed_s35_c5.log"
tail -2 "$OUT/pytest_changed_s35_c5.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s35_c5.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 280 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 8192 32768 \
    --mla tensor-cores fp32 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s35_c5.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s35_c5.json" 2>/dev/null; rmdir "$OUT/prefill" 2>/dev/null
grep -E "tokens, chunk|^ *[0-9.]+ \||equal" "$OUT/prefill_s35_c5.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
