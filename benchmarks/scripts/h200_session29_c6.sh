#!/usr/bin/env bash
# Session 29 call 6 on ONE H200, warm after call 5 (carry .whl, .triton_cache.tar.gz): the README's
# SwiGLU and decode GEMM tables on the pinned toolchain, in the session's last ~170 s of device
# time (run inline as one command line; this file records it).
set -u
source "$(dirname "$0")/device_env.sh" >/dev/null 2>&1
for b in "kernels_swiglu 50 --all-shapes" "kernels_gemm 100 --inductor"; do
    set -- $b; n=$1; l=$2; shift 2
    CUDA_VISIBLE_DEVICES=0 timeout $l python3 -m benchmarks.$n --out $OUT/k "$@" 2>&1 \
        | grep -v "UserWarning\|warnings.warn\|^$" > $OUT/$n.log
    echo "$n exit ${PIPESTATUS[0]}"; cp $OUT/k/*.json $OUT/ 2>/dev/null; rm -rf $OUT/k
done
ls $OUT
