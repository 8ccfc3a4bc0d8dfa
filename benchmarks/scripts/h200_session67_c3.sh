#!/usr/bin/env bash
# Session 67 call 3 (carry .whl; the last ~550 s of device time): one-tile MLA splits again. At
# 8192 a split is two 64-row tiles on 67 of 132 SMs at T = 1; session 21 timed 64-row splits
# (134 programs) at 36.2 us with the table's 3 stages on one tile, 19.9 with 32-row tiles, against
# 14.0. Without a pipeline (1 stage) a one-tile program loads and computes once: does a 64-row
# split then use the idle SMs? kernels_attn's MLA at 8192, T = 1 and 6, configs
# split_len,block_l,num_stages,num_warps.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
timeout 200 python3 -m benchmarks.kernels_attn --no-norms --no-inductor --no-gqa --no-gqa-layer --context 8192 \
    --t 1 6 --replays 50 --mla-config 64,64,1,8 --mla-config 64,64,2,8 --mla-config 64,64,1,4 \
    --mla-config 64,32,2,8 --mla-config 128,64,2,8 --mla-config 128,128,1,8 --out "$OUT/ka" 2>&1 \
    | stamp > "$OUT/kernels_attn_splits.log"
mv "$OUT/ka/kernels_attn.json" "$OUT/kernels_attn_splits.json"; rm -rf "$OUT/ka"
grep -E "mla_decode|copy bandwidth|skipped|Error|FAILED" "$OUT/kernels_attn_splits.log" | grep -v "eager\|no-pdl" | cut -c1-150
ls "$OUT"
