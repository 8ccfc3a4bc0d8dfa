#!/usr/bin/env bash
# Session 60 call 1 (carry .whl .triton_cache.tar.gz; timeout_s ~600): sampled drafts on the GPU:
# the op's and the engine's GPU tests, then the decode benchmark's sampled graphs (verify_sample and
# the three graphs of sampled drafts) at top_p 0.9 and 1 beside the greedy relay.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
DURATIONS=12 timeout 250 $PYT tests/test_sampled_targets.py tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
lingc_decode 0 320 --sampled-verify --sampled-top-p 0.9 1 --tokens 32
grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph" "$OUT/decode.log" | head -24
save_triton_cache
