#!/usr/bin/env bash
# The MoE up-GEMM's register cap and shared-expert-first grid, on a 2-GPU H200 host:
#   GPU 0: flash-tp4-rank decode, lingc plain and relay, --profile;
#   GPU 1: the MoE sweep (register cap 0 vs 96, T = 1 and 6), then the MoE GPU tests.
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 ${P0:-300} --profile &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-120} python3 -m benchmarks.moe_sweep --out "$OUT/m" --set regs \
    2>&1 | stamp > "$OUT/moe_sweep.log"; cp "$OUT"/m/*.json "$OUT/moe_sweep.json"
 CUDA_VISIBLE_DEVICES=1 timeout ${P2:-200} $PYT tests/test_moe_experts.py tests/test_moe_kernels.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/m"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
