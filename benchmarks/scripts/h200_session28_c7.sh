#!/usr/bin/env bash
# Session 28 call 7 on ONE H200 (carry .whl): the GPU tests of lingc.toolchain (a lingc kernel compiled
# after Inductor carries the PTX version of Triton's keyed ptxas) and of gpu_state, from an empty cache.
set -u
source benchmarks/scripts/device_env.sh
rm -rf .triton_cache/*
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_toolchain.py tests/test_gpu_state.py 2>&1 | tail -4
