#!/usr/bin/env bash
# Session 21 call 9 on ONE H200 (carry .whl, .triton_cache.tar.gz): the MLA GPU tests after the
# register-cap knob (MlaDecodeConfig.max_registers) and its test.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -4 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
