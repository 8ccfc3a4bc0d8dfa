#!/usr/bin/env bash
# Session 40 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz): the changed files' GPU tests
# (captured prefill, KDA prefill with the walk configurations, the prefill benchmark), then
# captured against eager at 1024 / 4096 / 8192 tokens after the padding's cheaper masks.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_prefill_graphs.py \
    tests/test_kda_prefill.py tests/test_benchmark_smoke.py -k "prefill or kda or walk or Prefill" 2>&1 \
    | stamp > "$OUT/pytest_changed.log"
tail -2 "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
PREFILL_TOKENS="1024 4096 8192" PREFILL_LIMIT=200 PREFILL_ARGS="--reps 5" prefill_as prefill_s40_c7
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
