#!/usr/bin/env bash
# Session 14, call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz), the budget's last minutes:
# the MoE layer and attention micro-benchmarks on the session's final kernels (the figures in
# benchmarks/results were from 2026-11-29).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 250 python3 -m benchmarks.kernels --out "$OUT/k" --only moe,attn 2>&1 \
    | stamp > "$OUT/kernels.log"
cp "$OUT"/k/*.json "$OUT"/ 2>/dev/null; cp "$OUT"/k/*.md "$OUT"/ 2>/dev/null; rm -rf "$OUT/k"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
