#!/usr/bin/env bash
# Session 37 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive 0e2ea1e):
# time to first token before (0e2ea1e, the single-pass KDA prefill kernel) and after (the three
# kernels at 3xTF32) in one call, new / base / new so that drift shows. Expected ~250 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
prefill_as prefill_new_s37_c3
prefill_as prefill_base_s37_c3 base
prefill_as prefill_new2_s37_c3
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
