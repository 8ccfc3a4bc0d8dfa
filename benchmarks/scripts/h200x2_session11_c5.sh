#!/usr/bin/env bash
# Session 11, call 5 (nvidia-h200-x2; carry .whl, .triton_cache.tar.gz): the final check.
#   1. lingc plain and relay on GPU 0 with NOTHING else running on the host (compile + capture in a
#      fresh process with a warm Triton cache, without the CPU contention of calls 1-2), on the
#      passes that walk less (stage_commit, pdl_swap);
#   2. then the GPU tests, split over the two GPUs (the graph-level ones on GPU 0, the kernels on 1).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
decode_as 0 decode_final 300 lingc,lingc-nextn 48
A="tests/test_relay.py tests/test_batch_invariance.py tests/test_backend_gpu.py tests/test_pdl_swap.py tests/test_stage_commit.py tests/test_fused_moe.py tests/test_fuse_projections.py"
(CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread $A 2>&1 | stamp > "$OUT/pytest_gpu0.log") &
(CUDA_VISIBLE_DEVICES=1 timeout 200 $PYT --timeout 150 --timeout-method thread tests \
    $(for f in $A tests/test_tensor_parallel.py; do echo --ignore=$f; done) 2>&1 | stamp > "$OUT/pytest_gpu1.log") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
