#!/usr/bin/env bash
# Session 57 call 4 (carry .whl; timeout_s ~220): where lingc.sampled_targets spends its time (the
# passes by name under torch.profiler) and its micro-benchmark at 39296 without Inductor (whose
# compile of the reference failed in call 2). Call 5 then ran benchmarks/scripts/
# probe_sampled_passes.py alone (each pass timed alone, registers and spills of each).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/scripts/probe_sampled_passes.py --profile 2>&1 | stamp | tail -8
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 1 6 --vocab 39296 \
    2>&1 | stamp > "$OUT/kernels_sampling.log"
grep -E "\|" "$OUT/kernels_sampling.log"; grep -iE "error|failed" "$OUT/kernels_sampling.log" | head -5
