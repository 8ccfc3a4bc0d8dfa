#!/usr/bin/env bash
# Session 68 call 3 (carry .whl; the last ~730 s of device time): call 2's A/B again after the
# split-K winner of gemm_normed requests its sums of squares before its partials (one L2 round
# trip for both; in call 2 they came after, and the folded GEMMs took ~1.1 us more a layer).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
decode_as 0 fold 170 lingc,lingc-nextn 32
PRELUDE="from lingc.passes.pdl_swap import PdlSwap
PdlSwap.fold_moe_norm = False
print('prelude: fold_moe_norm off', flush=True)" \
    decode_as 0 nofold 170 lingc,lingc-nextn 32
for f in fold nofold; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|greedy output|Error|prelude|_rmsnorm_kernel|_gemm_kernel|_moe_down|chain bound" \
        "$OUT/$f.log" | cut -c1-170 | head -20
done
ls "$OUT"
