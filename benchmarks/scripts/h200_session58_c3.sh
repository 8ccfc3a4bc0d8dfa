#!/usr/bin/env bash
# Session 58 call 3 (carry .whl .triton_cache.tar.gz; timeout_s ~200): the kept sampled_targets build's
# sampled graphs at top_p 0.9 and 1 against greedy's (call 2 timed the dropped early-decision build).
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
lingc_decode 0 170 --sampled-verify --sampled-top-p 0.9 1
grep -E "^\S*\s*\| lingc|_sample|greedy output|Error" "$OUT/decode.log" | head -10
