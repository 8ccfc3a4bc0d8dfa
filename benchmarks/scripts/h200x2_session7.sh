#!/usr/bin/env bash
# Session 7, call 3, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: flash-tp4-rank decode, lingc plain and relay, --profile (the KDA chain's and the
#          router's next-row prefetch);
#   GPU 1: the KDA chain benchmark (T = 1, 6, with fla-core as the peer), the MLA config sweep
#          (contexts 8192 and 65536, T = 1 and 6), then the KDA, router and MLA GPU tests.
# At most 8 files come back.
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 ${P0:-300} --profile &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-90} python3 -m benchmarks.kernels_kda --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels.log"
 CUDA_VISIBLE_DEVICES=1 timeout ${P2:-150} python3 -m benchmarks.kernels_attn --out "$OUT/a" --no-inductor --no-norms \
    --mla-config 128,32,3,8 --mla-config 128,64,2,8 --mla-config 128,64,3,8 --mla-config 64,32,2,8 \
    --mla-config 64,64,2,8 --mla-config 128,32,2,8,32 --mla-config 128,32,2,8,128 --mla-config 128,16,4,8 \
    2>&1 | stamp >> "$OUT/kernels.log"
 cp "$OUT/k/kernels_kda.json" "$OUT/kernels_kda.json"; cp "$OUT/a/kernels_attn.json" "$OUT/kernels_attn.json"
 CUDA_VISIBLE_DEVICES=1 timeout ${P3:-150} $PYT tests/test_kda_kernel.py tests/test_moe_kernels.py tests/test_mla_decode.py \
    tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/k" "$OUT/a"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
