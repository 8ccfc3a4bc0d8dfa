#!/usr/bin/env bash
# Session 21 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): the functionalised capture
# (LingcOptions.capture = "functionalize", one trace instead of AOTAutograd's two; session 20 on
# the CPU: relay roles of a 42-layer model 42 s against 65 s, the same ops and bits):
#   1. every single-GPU test file with LINGC_CAPTURE=functionalize (the relay file runs both
#      captures by itself);
#   2. decode, plain + relay (--profile), LINGC_CAPTURE=aot against functionalize in one call:
#      compile + capture seconds (issue 7's goal: under 60 s warm), step times, speculative ==
#      plain. If it holds, make "functionalize" the default.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
LINGC_CAPTURE=functionalize CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 240 --timeout-method thread \
    tests/ --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_capture_aot 150 lingc,lingc-nextn 48 LINGC_CAPTURE=aot
decode_as 0 decode_capture_functionalize 150 lingc,lingc-nextn 48 LINGC_CAPTURE=functionalize
grep -E "^ *[0-9.]+ \| lingc|greedy output|compile|by kind" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
