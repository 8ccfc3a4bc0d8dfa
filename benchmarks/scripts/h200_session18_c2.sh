#!/usr/bin/env bash
# Session 18 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz):
#   1. GPU test: MoE expert configs with the table's H chunks give the table's bits;
#   2. `benchmarks.moe_sweep --set chunk` at T = 1 and 6: which of those configs is fastest at
#      each T (a per-T choice among them keeps batch invariance).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 120 --timeout-method thread tests/test_moe_experts.py \
    -k "same_chunks or loop_design or batch_invariant" 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m benchmarks.moe_sweep --out "$OUT/m" --set chunk --t 1 6 --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
cp "$OUT"/m/*.json "$OUT/moe_sweep.json"; rm -rf "$OUT/m"
cat "$OUT/moe_sweep.log" | tail -40
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
