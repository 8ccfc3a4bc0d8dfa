#!/usr/bin/env bash
# Runs on commit 05894b6 (down_sums_partials and its probe were removed after these calls).
# Session 27 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): why the down-GEMM that sums
# the split-K partials faulted at T = 6 and crawled at T = 1 in call 2 (its GPU tests passed on a
# w_down with a row stride of I + 8, the model's is I): benchmarks/scripts/probe_sum_partials.py,
# one process per variant and form, CUDA_LAUNCH_BLOCKING=1 so a fault names its launch.
# Expected ~250 s; run with timeout_s 400.
set -u
source "$(dirname "$0")/device_env.sh"
for form in split strided; do
    for v in table h128w8 h64w8 h64w4; do
        [ "$v" = table ] && [ "$form" = strided ] && continue
        PYTHONPATH=$PWD:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 benchmarks/scripts/probe_sum_partials.py $v $form 2>&1 \
            | grep -v "Warning\|warn" | tail -3 | stamp | tee -a "$OUT/probe_sum_partials.log"
    done
done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
