#!/usr/bin/env bash
# Session 60 call 2 (carry .whl .triton_cache.tar.gz; timeout_s ~480): extend_sample's tail folded into
# relay_advance's DRAWN form: its GPU tests (the kernel's new form, the sampled-draft engine), then the
# sampled graphs timed again beside the greedy relay.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
DURATIONS=8 timeout 200 $PYT tests/test_relay_advance.py tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
lingc_decode 0 250 --sampled-verify --sampled-top-p 0.9 1 --tokens 32
grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph" "$OUT/decode.log" | head -24
save_triton_cache
