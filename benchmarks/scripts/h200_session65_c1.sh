#!/usr/bin/env bash
# Session 65 call 1 (carry .whl; timeout_s ~590; ran at d3419f7, the trial the next commit reverted,
# saved as benchmarks/results/router_logits_mma_s65_c1.patch): the router's logits on tensor cores
# (runtime/kernels/moe_router/logits_mma.py: split-K partials over 16-row MMA tiles, summed and
# scaled by the selection launch, which also writes y). The router GPU tests (both logits kernels
# at Ling-3's shapes, batch invariance, the Llama form's unfused-pair bits, the router -> align
# chain under capture), then the decode step, plain and relay with --profile, with the MMA logits
# (the default) against LOGITS_MMA = False (the vector kernel) in the same call.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=6 timeout 170 $PYT tests/test_rmsnorm_router.py tests/test_moe_kernels.py -k "router or select or ling3" \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -8
decode_as 0 mma_on 200 lingc,lingc-nextn 32
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as K; K.LOGITS_MMA = False" \
    decode_as 0 mma_off 170 lingc,lingc-nextn 32
for f in mma_on mma_off; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|_moe_router_|by kind|chain bound" "$OUT/$f.log" | head -24
done
ls "$OUT"
