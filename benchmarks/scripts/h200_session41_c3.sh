#!/usr/bin/env bash
# Session 41 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): where a captured prefill's
# GPU time goes, kernel by kernel, at 1024 and 8192 tokens (--profile-captured), and the
# benchmark's GPU smoke test of that option.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT --timeout 100 --timeout-method thread tests/test_benchmark_smoke.py \
    -k "captured_prefill" 2>&1 | stamp > "$OUT/pytest_changed.log"
tail -1 "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
for n in 1024 8192; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens $n \
        --graphs captured --reps 3 --profile-captured $n --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_profile_${n}_s41_c3.log"
    mv "$OUT/p/prefill.json" "$OUT/prefill_profile_${n}_s41_c3.json"
    mv "$OUT/p/prefill_captured_trace.json.gz" "$OUT/prefill_captured_trace_${n}_s41_c3.json.gz"; rm -rf "$OUT/p"
    grep -E "profiled prefill|tokens, captured" "$OUT/prefill_profile_${n}_s41_c3.log" | cut -c9-
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
