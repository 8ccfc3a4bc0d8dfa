#!/usr/bin/env bash
# Session 39 call 9 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 345f1a1, the
# session's start): prefill at 1024 / 8192 / 32768 tokens, this commit then the session's start, in
# one call.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
prefill_as prefill_new_s39_c9
prefill_as prefill_base_s39_c9 base
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
