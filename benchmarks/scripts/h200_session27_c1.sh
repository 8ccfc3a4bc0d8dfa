#!/usr/bin/env bash
# Session 27 call 1 on ONE H200 (carry .whl): every single-GPU test file's gpu-marked tests
# (session 26 added GPU tests for gather_probe and kernels_kda's Inductor column and changed
# gemm_argmax_triton to take out=, none run on a GPU yet), then session 26's refused call 5:
# the decode benchmark's sanity lines with the T = 6 verify's distinct-expert count, and
# benchmarks.gather_probe (the routed up-GEMM's tile reads with its structure added piece by
# piece). Last, the Triton cache the code in use compiled, for the next calls.
# Expected ~420 s (gpu tests ~250 s cold, sanity ~60 s, probe ~40 s); run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
gpu_tests 300
bash "$(dirname "$0")/h200_session26_c5.sh" 2>&1 | tail -40
save_triton_cache
