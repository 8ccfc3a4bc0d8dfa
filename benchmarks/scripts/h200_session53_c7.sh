#!/usr/bin/env bash
# Session 53 call 7 (carry .whl, .triton_cache.tar.gz; timeout_s ~110): the bf16 gated-attention
# GPU tests after pdl_swap_gqa walks below views as well as casts (call 6 left that attention).
set -u
DURATIONS=2 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=line -q \
    tests/test_foreign_model.py -k "gated" 2>&1 | tail -4
