#!/usr/bin/env bash
# Session 9, call 6, on a 2-GPU H200 host (nvidia-h200-x2): how fast a PDL chain of pure reads
# streams cold bytes of the decode step's sizes (5.2, 26, 63 and 200 MB), against the lingc GEMM
# on the same bytes in the same run (benchmarks/read_probe.py). GPU 0 only.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.read_probe --out "$OUT/r" 2>&1 | stamp > "$OUT/read_probe.log"
cp "$OUT/r/read_probe.json" "$OUT/read_probe.json"; rm -rf "$OUT/r"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
