#!/usr/bin/env bash
# The MLA query-tile change measured on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: the attention kernel micro-benchmark (MLA and KDA, T = 1 and 6, contexts 8192 and
#          65536), then flash-tp4-rank decode, lingc plain and relay;
#   GPU 1: the MLA, batch-invariance and relay GPU tests.
# At most 8 files come back: the logs, two JSON, the Triton cache.
set -u
source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout ${P0:-90} python3 -m benchmarks.kernels_attn --out "$OUT/k" --no-inductor --no-norms \
    2>&1 | stamp > "$OUT/kernels_attn.log"; cp "$OUT/k/kernels_attn.json" "$OUT/kernels_attn.json"
 lingc_decode 0 ${P1:-230}) &
(CUDA_VISIBLE_DEVICES=1 timeout ${P2:-200} $PYT tests/test_mla_decode.py tests/test_batch_invariance.py tests/test_relay.py \
    2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/k"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
