#!/usr/bin/env bash
# Session 64 call 2 (carry .whl; timeout_s ~590; run with benchmarks/results/
# align_in_selection_s64_c2.patch applied, which the session did not keep): moe_align in the
# router's selection (lingc.rmsnorm_router_align, passes/pdl_align_fold.py), CPU-built: the router, align and
# expert GPU tests (the folded chain under capture, PDL on and off), then the relay step with
# the fold (the table's default) against PdlSwap.fold_align = False in the same call, with
# --profile (the selection's and align's critical us), then the relay GPU tests (verify's
# graphs carry the fold: 256-token speculative == plain).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=6 timeout 150 $PYT tests/test_moe_kernels.py tests/test_moe_experts.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -8
decode_as 0 fold_on 170 lingc-nextn 32
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_align = False" \
    decode_as 0 fold_off 130 lingc-nextn 32
for f in fold_on fold_off; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|_moe_align_kernel|_moe_router_select|by kind" "$OUT/$f.log" | head -14
done
DURATIONS=4 timeout 120 $PYT tests/test_relay.py 2>&1 | stamp >> "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -1
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | tail -5
ls "$OUT"
