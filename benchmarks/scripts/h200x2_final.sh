#!/usr/bin/env bash
# A closing device call on a 2-GPU H200 host (nvidia-h200-x2), three phases with their own limits:
#   1  GPU 0: flash-tp4-rank decode, lingc plain and relay (the speculative == plain check);
#      GPU 1: the GPU tests of the changed kernels and of the relay
#   2  both GPUs: the tensor-parallel GPU tests (hang stacks to $OUT/rank<r>.stacks)
#   3  both GPUs: the full flash preset (random weights, ~124 GB per GPU), 2-way tensor parallel,
#      lingc plain and relay
# Setup: device_env.sh. Logs and JSON under $OUT (JSON copied to its root).
set -u
source "$(dirname "$0")/device_env.sh"
BENCH="--context 8192 --lingc-inductor 0 --modes lingc,lingc-nextn"
lingc_decode 0 ${P1:-170} &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-200} $PYT ${TESTS:-tests/test_moe_experts.py tests/test_head_matmul.py \
    tests/test_relay.py tests/test_kda_kernel.py tests/test_batch_invariance.py} 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
LINGC_TEST_HANG_DUMP_S=$((${P2:-230} - 15)) LINGC_TEST_HANG_DUMP_DIR="$OUT" timeout ${P2:-230} $PYT \
    tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_tp2.log"
timeout ${P3:-165} torchrun --nproc-per-node 2 -m benchmarks.decode --tp 2 --preset flash $BENCH --tokens 32 \
    --out "$OUT/f" 2>&1 | stamp > "$OUT/flash_tp2.log"; cp "$OUT/f/decode_tp2.json" "$OUT/decode_flash_tp2.json"
save_triton_cache; rm -rf "$OUT/f"; ls -la "$OUT"
