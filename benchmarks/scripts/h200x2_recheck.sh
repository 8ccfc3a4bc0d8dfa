#!/usr/bin/env bash
# A re-check on a 2-GPU H200 host (nvidia-h200-x2) after a correctness fix, two phases:
#   1  GPU 0: flash-tp4-rank decode, lingc plain and relay (the speculative == plain check);
#      GPU 1: the KDA kernel and batch-invariance GPU tests
#   2  both GPUs: the tensor-parallel GPU tests (hang stacks to $OUT/rank<r>.stacks)
# At most 8 files come back from the device tool: the logs, one JSON, the Triton cache; empty
# files are dropped.
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 ${P1:-200} &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-200} $PYT ${TESTS:-tests/test_kda_kernel.py tests/test_batch_invariance.py} \
    2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
LINGC_TEST_HANG_DUMP_S=${HANG_S:-180} LINGC_TEST_HANG_DUMP_DIR="$OUT" timeout ${P2:-330} $PYT \
    tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_tp2.log"
save_triton_cache; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
