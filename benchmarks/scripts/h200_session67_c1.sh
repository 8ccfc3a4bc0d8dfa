#!/usr/bin/env bash
# Session 67 call 1 (carry .whl): what the MLA split kernel's in-kernel RoPE of q costs. The sm_90
# SASS (CPU) shows every thread computing 16 angles' sin and cos (32 libdevice calls, each a
# branchy range reduction) in a layout replicated over all 8 warps, before the first cache tile
# load is issued. `lingc-q-roped` runs the same split + combine on q_rope rotated beforehand.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
timeout 150 python3 -m benchmarks.kernels_attn --no-norms --no-inductor --no-gqa --no-gqa-layer --context 8192 \
    --t 1 6 --replays 50 --out "$OUT/ka" 2>&1 | stamp > "$OUT/kernels_attn_rope.log"
mv "$OUT/ka/kernels_attn.json" "$OUT/kernels_attn_rope.json"; rm -rf "$OUT/ka"
grep -E "mla_decode|copy bandwidth|Error|FAILED" "$OUT/kernels_attn_rope.log" | head -30
ls "$OUT"
