#!/usr/bin/env bash
# Session 17 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz): the MoE up-GEMM's loop design
# (block_k > 0: the H chunk streamed through a pipelined tile loop, so the bytes in flight are not
# bounded by the registers that hold a one-shot chunk).
#   1. the MoE experts GPU tests (the loop design's included);
#   2. the MoE layer alone at T = 1 and 6: the table against the loop candidates (--set loop);
#   3. if a loop config wins the sweep, decode (plain + relay, --profile) with the table and with
#      that config in the table (a prelude), in one call.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 120 --timeout-method thread tests/test_moe_experts.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.moe_sweep --out "$OUT/moe" --set loop --t 1 6 --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
cp "$OUT/moe/moe_sweep_flash-tp4-rank.json" "$OUT/moe_sweep_loop.json"; rm -rf "$OUT/moe"
grep -E "\| [16] \||best" "$OUT/moe_sweep.log"
if grep -q "best over.*bk" "$OUT/moe_sweep.log"; then
    decode_as 0 decode_table 150 lingc,lingc-nextn 48
    PRELUDE="import json, lingc.runtime.kernels.moe_experts.kernel as K
best = next(r['config'] for r in json.load(open('$OUT/moe_sweep_loop.json'))['rows'] if r.get('best') == '<-')
K.CONFIGS[(192, 2560)] = K.MoeExpertsConfig(**best)
print('experts config', K.CONFIGS[(192, 2560)], flush=True)" decode_as 0 decode_loop 150 lingc,lingc-nextn 48
    grep -E "experts config|^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains" "$OUT"/decode_*.log
fi
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
