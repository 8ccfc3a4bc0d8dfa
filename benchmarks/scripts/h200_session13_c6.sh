#!/usr/bin/env bash
# Session 13, call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz): the router selection with 1, 2, 4 warps per row (probe_select_warps.py)
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD:$PYTHONPATH timeout 300 python3 benchmarks/scripts/probe_select_warps.py "$OUT/probe_select_warps.json" 2>&1 \
    | stamp > "$OUT/probe_select_warps.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
