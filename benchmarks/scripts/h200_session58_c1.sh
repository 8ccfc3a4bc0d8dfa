#!/usr/bin/env bash
# Session 58 call 1 (carry .whl .triton_cache.tar.gz; timeout_s ~420): the README table's lingc rows
# at HEAD (32 tokens, the README's command) on whichever GPU came, then the sampling op's baseline
# for this session's tuning: its passes alone and under the profiler, and the micro-benchmark.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
table_modes table_lingc lingc,lingc-nextn 300
grep -E "^\S*\s*\||speculative|bandwidth|Error" "$OUT/table_lingc.log" | head -16
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 benchmarks/scripts/probe_sampled_passes.py 2>&1 | stamp > "$OUT/probe.log"
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 benchmarks/scripts/probe_sampled_passes.py --profile 2>&1 | stamp >> "$OUT/probe.log"
grep -vE "Warning|warn" "$OUT/probe.log" | head -40
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 1 6 --vocab 39296 \
    --replays 10 2>&1 | stamp > "$OUT/kernels_sampling.log"
grep -E "\|" "$OUT/kernels_sampling.log"
save_triton_cache
