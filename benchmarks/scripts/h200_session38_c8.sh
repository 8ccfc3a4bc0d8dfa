#!/usr/bin/env bash
# Session 38 call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 7c70201, call 6's
# commit): the grouped MoE's SwiGLU on lingc::moe_swiglu and the shared add in the combine kernel,
# this commit / 7c70201 / this commit in one call; the GPU tests of the changed files.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
prefill_as prefill_new_s38_c8
prefill_as prefill_base_s38_c8 base
prefill_as prefill_new2_s38_c8
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_moe_swiglu.py tests/test_moe_combine.py tests/test_moe.py \
    tests/test_model.py 2>&1 | stamp > "$OUT/pytest_changed_s38_c8.log"
tail -2 "$OUT/pytest_changed_s38_c8.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c8.log" | head
cat "$OUT"/prefill_new2_s38_c8.log >> "$OUT/prefill_new_s38_c8.log"; rm -f "$OUT/prefill_new2_s38_c8.log"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
