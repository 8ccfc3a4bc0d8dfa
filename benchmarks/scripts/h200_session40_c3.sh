#!/usr/bin/env bash
# Session 40 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the main job on the GPU (the
# prompt's prefill captured with the step graphs), the changed files' GPU tests, then prefill
# captured against eager at 1000 / 1024 / 2048 / 4096 tokens, reps 5, with a profiled 1024-token
# eager prefill (GPU time by kind: what a captured prefill's GPU runs).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m lingc run --preset tiny --new-tokens 16 2>&1 | stamp > "$OUT/lingc_run_gpu.log"
tail -6 "$OUT/lingc_run_gpu.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 120 --timeout-method thread tests/test_prefill_graphs.py \
    tests/test_cli.py 2>&1 | stamp > "$OUT/pytest_changed.log"
tail -2 "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
PREFILL_TOKENS="1000 1024 2048 4096" PREFILL_LIMIT=200 PREFILL_ARGS="--reps 5 --profile 1024" prefill_as prefill_s40_c3
grep -A8 "GPU time by kind" "$OUT/prefill_s40_c3.log" | cut -c9- | cut -c1-200
rm -f "$OUT"/prefill_trace.json.gz
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
