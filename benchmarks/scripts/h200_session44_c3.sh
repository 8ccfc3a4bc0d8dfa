#!/usr/bin/env bash
# Session 44 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 2): what call 2's
# last group did not reach in its 120 s (it stopped inside test_gemm.py, no failure), and session
# 41's KDA prefill kernel change (chunk offset / range, segmented walks): its test file whole.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_gemm.py tests/test_swiglu_gemm.py tests/test_mla_kv_write.py 2>&1 | stamp > "$OUT/pytest_s44_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 180 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_prefill.py 2>&1 | stamp >> "$OUT/pytest_s44_c3.log"
grep -E "passed|failed" "$OUT/pytest_s44_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_s44_c3.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
