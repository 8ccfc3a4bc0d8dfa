#!/usr/bin/env bash
# Session 68 call 2 (carry .whl): the layer-input norm after the MoE folded into the MoE's combine
# and the projection GEMM (lingc::moe_experts_norm + lingc::gemm_normed; runtime/kernels/
# moe_experts/norm_fold.md). The new kernels' tests on CUDA (every test of the file), then the
# decode step with the fold (the table now) against PdlSwap.fold_moe_norm = False in one call,
# plain and relay with --profile, then the relay's 256-token speculative == plain gate and the
# touched kernels' GPU tests.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_norm_fold.py 2>&1 \
    | stamp > "$OUT/pytest_norm_fold.log"
tail -1 "$OUT/pytest_norm_fold.log"; grep -E "FAILED|Error" "$OUT/pytest_norm_fold.log" | head -8
decode_as 0 fold 170 lingc,lingc-nextn 32
PRELUDE="from lingc.passes.pdl_swap import PdlSwap
PdlSwap.fold_moe_norm = False
print('prelude: fold_moe_norm off', flush=True)" \
    decode_as 0 nofold 170 lingc,lingc-nextn 32
for f in fold nofold; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|prelude|_rmsnorm_kernel|_gemm_kernel|_moe_down|chain bound" \
        "$OUT/$f.log" | cut -c1-170 | head -20
done
DURATIONS=8 timeout 150 $PYT tests/test_relay.py tests/test_gemm.py tests/test_moe_experts.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
ls "$OUT"
