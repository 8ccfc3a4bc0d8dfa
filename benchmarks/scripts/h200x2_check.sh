#!/usr/bin/env bash
# One device call on a 2-GPU H200 host (the device tool's nvidia-h200-x2):
#   phase 1, in parallel:
#     GPU 0  the MoE sweep (router and expert kernels per launch), then flash-tp4-rank decode with
#            lingc plain and relay, with a per-kernel profile of each graph
#     GPU 1  the GPU tests of the MoE kernels and of the relay (a stack dump past TEST_S)
#   phase 2: the 2-GPU tensor-parallel tests (each rank writes its stacks to $OUT/rank<r>.stacks
#            past HANG_S)
# Setup (environment, install, Triton cache): device_env.sh. Logs and JSON under $OUT.
set -u
source "$(dirname "$0")/device_env.sh"
P1=${P1:-330}; P2=${P2:-190}; TEST_S=${TEST_S:-200}; HANG_S=${HANG_S:-160}
START=$(date +%s); left() { echo $((P1 - ($(date +%s) - START))); }
(CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.moe_sweep --out "$OUT" 2>&1 | stamp > "$OUT/moe_sweep.log"
 lingc_decode 0 $(left) --tokens 96 --modes ${MODES:-lingc,lingc-nextn} --profile) &
(CUDA_VISIBLE_DEVICES=1 timeout $P1 $PYT --timeout $TEST_S --timeout-method thread \
    ${TESTS:-tests/test_moe_kernels.py tests/test_moe_experts.py tests/test_relay.py} 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
LINGC_TEST_HANG_DUMP_S=$HANG_S LINGC_TEST_HANG_DUMP_DIR="$OUT" timeout $P2 $PYT tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_tp2.log"
save_triton_cache; ls -la "$OUT"
