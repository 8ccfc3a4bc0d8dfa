#!/usr/bin/env bash
# The GPU test suite and the single-GPU benchmarks in one call on a 2-GPU H200 host (the device
# tool's nvidia-h200-x2):
#   phase 1, in parallel:
#     GPU 0  the MoE sweep, the MLA split-length sweep, then flash-tp4-rank decode with lingc
#            plain and relay (per-kernel profile of each graph)
#     GPU 1  every single-GPU test file (the relay's included)
#   phase 2: the 2-GPU tensor-parallel tests
# Setup (environment, install, Triton cache): device_env.sh. Logs and JSON under $OUT (JSON also
# copied to $OUT's root: files in sub-folders do not always come back).
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
P1=${P1:-400}; P2=${P2:-130}
START=$(date +%s); left() { echo $((P1 - ($(date +%s) - START))); }
(CUDA_VISIBLE_DEVICES=0 timeout 70 python3 -m benchmarks.moe_sweep --out "$OUT" 2>&1 | stamp > "$OUT/moe_sweep.log"
 CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.kernels_attn --out "$OUT/attn" --no-inductor --no-norms \
    --split-len ${SPLITS:-32 64 256} 2>&1 | stamp > "$OUT/attn.log"; cp "$OUT"/attn/*.json "$OUT/" 2>/dev/null
 lingc_decode 0 $(left) --tokens ${TOKENS:-64} --modes ${MODES:-lingc,lingc-nextn} --profile) &
(CUDA_VISIBLE_DEVICES=1 timeout $P1 $PYT --timeout 200 --timeout-method thread \
    ${TESTS:-tests --ignore=tests/test_tensor_parallel.py} 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
LINGC_TEST_HANG_DUMP_S=$((P2 - 15)) LINGC_TEST_HANG_DUMP_DIR="$OUT" timeout $P2 $PYT tests/test_tensor_parallel.py 2>&1 \
    | stamp > "$OUT/pytest_tp2.log"
save_triton_cache; rm -rf "$OUT/attn"; ls -la "$OUT"
