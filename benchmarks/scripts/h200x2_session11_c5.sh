#!/usr/bin/env bash
# Session 11, call 5 (nvidia-h200-x2; carry .whl, .triton_cache.tar.gz, .base.tar.gz = f900f64):
# the final check.
#   1. GPU 0: lingc plain and relay on this checkout (KDA commits merged into kda_commit_many,
#      passes that walk less); GPU 1 at the same time: the relay on f900f64 (lingc as in 39de3ba);
#   2. then the GPU tests, split over the two GPUs (the graph-level ones on GPU 0, the kernels on 1).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
(decode_as 0 decode_final 240 lingc,lingc-nextn 48) &
(BASE=1 decode_as 1 decode_base 240 lingc-nextn 48) &
wait
A="tests/test_relay.py tests/test_batch_invariance.py tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_stage_commit.py tests/test_fused_moe.py tests/test_fuse_projections.py"
(CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread $A 2>&1 | stamp > "$OUT/pytest_gpu0.log") &
(CUDA_VISIBLE_DEVICES=1 timeout 200 $PYT --timeout 150 --timeout-method thread tests \
    $(for f in $A tests/test_tensor_parallel.py; do echo --ignore=$f; done) 2>&1 | stamp > "$OUT/pytest_gpu1.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
