#!/usr/bin/env bash
# One device call on a 2-GPU H200 host (the device tool's nvidia-h200-x2), both GPUs in parallel:
#   GPU 0  the MoE expert-kernel sweep and per-launch breakdown, then flash-tp4-rank decode with
#          lingc plain and the lingc relay
#   GPU 1  the KDA kernel GPU tests and the relay's three-graph test (a stack dump if it runs past
#          TEST_S), then decode in the modes not measured yet on flash-tp4-rank (eager NEXTN,
#          Inductor default, reduce-overhead with Inductor's PDL)
# Setup (environment, install, Triton cache): device_env.sh. Logs and JSON under $OUT.
set -u
source "$(dirname "$0")/device_env.sh"
LIMIT=${LIMIT:-540}; TEST_S=${TEST_S:-150}
BENCH="--preset flash-tp4-rank --context 8192 --lingc-inductor 0 --tokens 96"
START=$(date +%s); left() { echo $((LIMIT - ($(date +%s) - START))); }
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.moe_sweep --out "$OUT" 2>&1 | stamp > "$OUT/moe_sweep.log"
 CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 -m benchmarks.decode $BENCH --modes ${MODES0:-lingc,lingc-nextn} \
    --out "$OUT/gpu0" 2>&1 | stamp > "$OUT/decode_gpu0.log") &
(CUDA_VISIBLE_DEVICES=1 timeout 100 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v \
    tests/test_kda_kernel.py 2>&1 | stamp > "$OUT/pytest_kda.log"
 CUDA_VISIBLE_DEVICES=1 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v \
    --timeout $TEST_S --timeout-method thread \
    "tests/test_relay.py::test_gpu_three_graphs_no_sync_run_ahead_no_recapture" 2>&1 | stamp > "$OUT/pytest_relay.log"
 CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m benchmarks.decode $BENCH \
    --modes ${MODES1:-eager-nextn,reduce-overhead-pdl,inductor} --out "$OUT/gpu1" 2>&1 | stamp > "$OUT/decode_gpu1.log") &
wait
save_triton_cache; ls -la "$OUT"
