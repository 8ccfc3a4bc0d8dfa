#!/usr/bin/env bash
# Session 38 call 1 on ONE H200 (carry .whl): the prefill chunk 4096 (default) against 8192 at 8192
# and 32768 tokens in one process, then a profile of an 8192-token prefill at 4096 with the GPU
# time split by kind and op (the new --profile table); the prefill benchmark's GPU smoke test.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 8192 32768 \
    --chunk 4096 8192 --profile 8192 --out "$OUT/prefill" 2>&1 | stamp > "$OUT/prefill_s38_c1.log"
mv "$OUT/prefill/prefill.json" "$OUT/prefill_s38_c1.json" 2>/dev/null; rm -rf "$OUT/prefill"
grep -E "^ *[0-9.]+ +[0-9]+ tokens, chunk|profiled|GPU time by kind|^ *[0-9.]+   [A-Za-z]|Error|error" "$OUT/prefill_s38_c1.log" | cut -c9- | cut -c1-400
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_benchmark_smoke.py -k prefill 2>&1 | stamp > "$OUT/pytest_changed_s38_c1.log"
tail -2 "$OUT/pytest_changed_s38_c1.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
