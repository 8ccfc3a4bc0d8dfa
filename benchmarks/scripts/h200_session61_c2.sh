#!/usr/bin/env bash
# Session 61 call 2 (carry .whl .triton_cache.tar.gz; timeout_s ~400): extend_sample's lm_head on the
# accepted row, written into relay.draft_logits by the GEMM (rows_picked_before_gemm +
# gemm_rows_into); the one-launch captures' edge check fixed (graph_edge_types of a one-kernel graph).
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
DURATIONS=8 timeout 60 $PYT "tests/test_sampled_targets.py::test_gpu_captured_without_a_nucleus_is_one_launch" \
    tests/test_relay_sampling.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
lingc_decode 0 200 --sampled-verify --sampled-top-p 1 --tokens 32
grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph" "$OUT/decode.log" | head -24
save_triton_cache
