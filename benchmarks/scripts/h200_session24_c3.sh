#!/usr/bin/env bash
# Session 24 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): lingc.rmsnorm_gemm alone
# against rmsnorm + gemm and the gemm alone (probe_norm_gemm.py), after call 2's decode step
# lost ~19 us a fused KDA projection with the fold.
set -u
source "$(dirname "$0")/device_env.sh"
PYTHONPATH=$PWD:$PYTHONPATH CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/scripts/probe_norm_gemm.py "$OUT/probe_norm_gemm.json" 2>&1 \
    | stamp > "$OUT/probe_norm_gemm.log"
cat "$OUT/probe_norm_gemm.log"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
