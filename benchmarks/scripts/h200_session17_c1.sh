#!/usr/bin/env bash
# Prepared at the end of session 16 for the next session's first call on ONE H200 (carry .whl,
# .triton_cache.tar.gz, and .base.tar.gz = `git archive --format=tar.gz -o .base.tar.gz a0ca68c`,
# the commit before the pair layout):
#   1. every single-GPU test file on this checkout: 4fc03b8's pair layout of the MoE experts (no
#      moe_align launch for 2..16 tokens) has run only under the Triton interpreter and ptxas;
#   2. the MoE layer alone at T = 1 and 6 on the table's config: pair layout against [align];
#   3. the decode A/B in one call: a0ca68c (BASE=1) against this checkout, plain and relay.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.moe_sweep --out "$OUT/moe" --set table --layers 40 \
    2>&1 | stamp > "$OUT/moe_sweep.log"
grep -E "\| [16] \|" "$OUT/moe_sweep.log"; cp "$OUT/moe/moe_sweep_flash-tp4-rank.json" "$OUT/moe_sweep_pairs.json"; rm -rf "$OUT/moe"
base_setup
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 48
decode_as 0 decode_pairs 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|kernels .* nodes|greedy output|by kind" "$OUT"/decode_*.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
