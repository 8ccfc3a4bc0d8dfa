#!/usr/bin/env bash
# Session 65 call 2 (carry .whl; timeout_s ~590; asked for an H200): on an H200 the README
# table's lingc rows at HEAD (none lent since session 45), then every single-GPU test file's GPU
# tests in the time left; on an H100 the whole GPU suite (its last whole run was session 48's).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
if [[ "$GPU" == *H200* ]]; then
    table_modes table_lingc lingc,lingc-nextn 250
    grep -E "^\S*\s*\||speculative|Error|copy bandwidth" "$OUT/table_lingc.log" | head -16
    gpu_tests 290
else
    gpu_tests 560
fi
ls "$OUT"
