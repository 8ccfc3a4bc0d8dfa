#!/usr/bin/env bash
# Session 66 call 1 (carry .whl; timeout_s ~280: 419 s of device time were left after
# failed starts). 1. benchmarks.expert_read_probe: does the up-GEMM's strided weight
# tile read slower than the same bytes contiguous? 2. moe_sweep --set blocked: the MoE layer with
# the up-GEMM reading blocked_w13 copies against the table's strided read (20 layers: the copies
# double w13's bytes). 3. The blocked layout's GPU test. (Session 65's CPU-only relay changes
# wait for a session with device time.) It ran at 9037606: benchmarks.expert_read_probe and
# moe_sweep --set blocked exist there only (removed after the call; the blocked layout is
# benchmarks/results/moe_blocked_w13_s66_c1.patch).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
timeout 70 python3 -m benchmarks.expert_read_probe --out "$OUT/erp" --experts 40 9 --tiles 64x256 32x512 2>&1 | stamp > "$OUT/expert_read_probe.log"
mv "$OUT/erp/expert_read_probe.json" "$OUT/"; rm -rf "$OUT/erp"
grep -E "^\s*\S*\s*\||copy bandwidth|Error" "$OUT/expert_read_probe.log" | head -22
timeout 110 python3 -m benchmarks.moe_sweep --set blocked --layers 20 --t 1 6 --out "$OUT/ms" 2>&1 | stamp > "$OUT/moe_sweep_blocked.log"
mv "$OUT"/ms/*.json "$OUT/moe_sweep_blocked.json"; rm -rf "$OUT/ms"
grep -E "\| (1|6) \||floor|best|Error" "$OUT/moe_sweep_blocked.log" | head -14
DURATIONS=8 timeout 60 $PYT tests/test_moe_experts.py::test_gpu_blocked_w13_gives_the_same_bits 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
ls "$OUT"
