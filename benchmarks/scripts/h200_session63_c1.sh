#!/usr/bin/env bash
# Session 63 call 1 (carry .whl and .triton_cache.tar.gz; timeout_s ~590): session 62's review
# commit dba6776, not GPU-run then (drawn_token_writes through direct_lingc_writes with the variant
# schema; the `_row_dist` helper in lingc.sampled_targets): the sampling op and relay GPU tests,
# the out-variant rewrites' tests (norms, verdicts, pdl_glue, relays), the sampled graphs at top_p
# 0.9 and 1 with --profile (the by-kind split on this card); on an H200 the README
# table's lingc rows at HEAD instead (none lent since session 45).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=8 timeout 220 $PYT tests/test_sampled_targets.py tests/test_relay_sampling.py \
    tests/test_pdl_glue.py tests/test_greedy_verdict.py tests/test_norm_kernels.py \
    tests/test_relay_advance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
if [[ "$GPU" == *H200* ]]; then   # the README table first: no H200 lent since session 45
    table_modes table_lingc lingc,lingc-nextn 200
    grep -E "^\S*\s*\||speculative|Error" "$OUT/table_lingc.log" | head -16
else
    lingc_decode 0 210 --sampled-verify --sampled-top-p 0.9 1 --tokens 32 --profile
    grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph|by kind" "$OUT/decode.log" | head -30
fi
save_triton_cache
ls "$OUT"
