#!/usr/bin/env bash
# Session 61 call 1 (carry .whl .triton_cache.tar.gz; timeout_s ~600): the draft's own draws as one
# launch (sampled_targets with top_p None) and its logits rows written by the lm_head GEMM
# (gemm_rows_into): the op's, the GEMM's and the engines' GPU tests, the op's cost per variant, then
# the sampled-draft graphs beside the greedy relay.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
DURATIONS=12 timeout 230 $PYT tests/test_sampled_targets.py tests/test_relay_sampling.py tests/test_spec_runner.py \
    "tests/test_gemm.py::test_gpu_rows_into_an_fp32_buffer" 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
timeout 60 python3 -m benchmarks.kernels_sampling --rows 1 6 --vocab 39296 --replays 10 --out "$OUT/ks" 2>&1 \
    | stamp > "$OUT/kernels_sampling.log"
cp "$OUT/ks/kernels_sampling.json" "$OUT/kernels_sampling.json" 2>/dev/null; rm -rf "$OUT/ks"
grep -E "^\S*\s*\|" "$OUT/kernels_sampling.log" | head -14
lingc_decode 0 260 --sampled-verify --sampled-top-p 1 --tokens 32
grep -E "^\S*\s*\| lingc|_sample|sampled drafts|greedy output|Error|per graph" "$OUT/decode.log" | head -24
save_triton_cache
