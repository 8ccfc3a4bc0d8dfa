#!/usr/bin/env bash
# Session 13, call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): design C (GEMV) against the
# launch table at M = 1 on the relay draft's shapes (probe_gemv_draft.py).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD:$PYTHONPATH timeout 300 python3 benchmarks/scripts/probe_gemv_draft.py "$OUT/probe_gemv_draft.json" 2>&1 \
    | stamp > "$OUT/probe_gemv_draft.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
