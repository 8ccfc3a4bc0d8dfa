#!/usr/bin/env bash
# Session 62 call 1 (carry .whl; no Triton cache this checkout; timeout_s ~590): session 61's
# call 2, not run then (extend_sample's lm_head on the accepted row written into relay.draft_logits
# by the GEMM; the one-launch captures' edge check fixed), and this session's q nucleus (the draft
# draws at the request's top_p; verify searches the draft rows' nucleus beside the target's):
# the op's and the relays' sampling GPU tests, the sampled graphs at top_p 0.9 and 1; on an H200
# also the README table's lingc rows at HEAD (none lent since session 45).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=8 timeout 220 $PYT tests/test_sampled_targets.py tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
lingc_decode 0 200 --sampled-verify --sampled-top-p 0.9 1 --tokens 32
grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph" "$OUT/decode.log" | head -24
if [[ "$GPU" == *H200* ]]; then
    table_modes table_lingc lingc,lingc-nextn 150
    grep -E "^\S*\s*\||speculative|Error" "$OUT/table_lingc.log" | head -16
fi
save_triton_cache
ls "$OUT"
