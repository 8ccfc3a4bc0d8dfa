#!/usr/bin/env bash
# Session 68 call 1 (carry .whl): what the 39 layer-input norms after the MoE cost a decode step,
# as a bound, before building a fold of them (the MoE combine writing h and h * w, the projection
# GEMM scaling its rows by rsqrt in the epilogue). The table against a prelude that drops those
# norms (wrong values, the same kernels otherwise: prelude_drop_moe_norms.py), one call, plain and
# relay with --profile.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
decode_as 0 table 170 lingc,lingc-nextn 32
PRELUDE="exec(open('benchmarks/scripts/prelude_drop_moe_norms.py').read())" \
    decode_as 0 drop_norms 170 lingc,lingc-nextn 32
for f in table drop_norms; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|prelude|_rmsnorm_kernel|chain bound" "$OUT/$f.log" | cut -c1-170 | head -16
done
ls "$OUT"
