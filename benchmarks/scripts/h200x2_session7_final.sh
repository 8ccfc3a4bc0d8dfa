#!/usr/bin/env bash
# Session 7, closing call, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: the MLA kernel benchmark (the table's new 64-row x 3-stage tiles against the former
#          32 x 2 at both contexts), the KDA chain benchmark (fla-core as the peer), then
#          flash-tp4-rank decode, lingc plain and relay, --profile;
#   GPU 1: every single-GPU test file.
# At most 8 files come back.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.kernels_attn --out "$OUT/a" --no-inductor --no-norms \
    --mla-config 128,32,2,8 --mla-config 512,32,2,8 --mla-config 512,64,3,8 2>&1 | stamp > "$OUT/kernels.log"
 CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.kernels_kda --out "$OUT/k" 2>&1 | stamp >> "$OUT/kernels.log"
 cp "$OUT/a/kernels_attn.json" "$OUT/kernels_attn.json"; cp "$OUT/k/kernels_kda.json" "$OUT/kernels_kda.json"
 lingc_decode 0 ${P0:-240} --profile) &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-420} $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
wait
save_triton_cache; rm -rf "$OUT/a" "$OUT/k"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
