#!/usr/bin/env bash
# The persistent MoE expert grids and the router's row prefetch, on a 2-GPU H200 host:
#   GPU 0: flash-tp4-rank decode, lingc plain and relay, with --profile (critical path by kernel);
#   GPU 1: the MoE sweep (persistent grids vs the one-shot grids, router and align rows, T = 1
#          and 6), then the MoE kernel GPU tests.
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 ${P0:-300} --profile &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-200} python3 -m benchmarks.moe_sweep --out "$OUT/m" --set persistent \
    2>&1 | stamp > "$OUT/moe_sweep.log"; cp "$OUT"/m/*.json "$OUT/moe_sweep.json"
 CUDA_VISIBLE_DEVICES=1 timeout ${P2:-200} $PYT tests/test_moe_experts.py tests/test_moe_kernels.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/m"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
