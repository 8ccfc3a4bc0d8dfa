#!/usr/bin/env bash
# Session 37 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive
# 3fda355): the prefill MoE's slot sum on one lingc::moe_combine_sorted kernel. Its GPU tests and
# the MoE's, then time to first token before (3fda355: index_copy, fp32 copy and the ATen slot sum)
# and after in one call, new / base / new. Expected ~200 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s37_c7.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_moe_combine.py tests/test_moe.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
base_setup
prefill_as prefill_new_s37_c7
prefill_as prefill_base_s37_c7 base
prefill_as prefill_new2_s37_c7
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
