#!/usr/bin/env bash
# The GPU test suite on a 2-GPU H200 host (the device tool's nvidia-h200-x2), in one call:
#   phase 1, in parallel: GPU 0 every single-GPU test file but the relay's; GPU 1 the relay's
#   phase 2: the 2-GPU tensor-parallel tests on both GPUs.
# Each log line carries the seconds since its phase began, so a cut run still says where time went.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
P1=${P1:-380}; P2=${P2:-170}
(CUDA_VISIBLE_DEVICES=0 timeout $P1 $PYT tests --ignore=tests/test_tensor_parallel.py \
    --ignore=tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"; echo "rc ${PIPESTATUS[0]}" >> "$OUT/pytest_gpu.log") &
(CUDA_VISIBLE_DEVICES=1 timeout $P1 $PYT tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_relay.log";
 echo "rc ${PIPESTATUS[0]}" >> "$OUT/pytest_relay.log") &
wait
timeout $P2 $PYT tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_tp2.log"; echo "rc ${PIPESTATUS[0]}" >> "$OUT/pytest_tp2.log"
