#!/usr/bin/env bash
# Session 18 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz):
#   1. GPU tests of the MoE experts (the GEMV up-GEMM at flash-tp4-rank shapes among them);
#   2. `benchmarks.moe_sweep --set gemv` at T = 1 and 6: the up-GEMM on CUDA cores against the
#      table's tensor-core up-GEMM (align + up + down per layer, 40 cold layers).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_moe_experts.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.moe_sweep --out "$OUT/m" --set gemv --t 1 6 --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
cp "$OUT"/m/*.json "$OUT/moe_sweep.json"; rm -rf "$OUT/m"
tail -25 "$OUT/moe_sweep.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
