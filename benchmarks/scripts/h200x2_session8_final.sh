#!/usr/bin/env bash
# Session 8, last call, on a 2-GPU H200 host (nvidia-h200-x2), with the default trigger placement
# now "small" over the norms and the MLA glue kernels:
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile), the default;
#   GPU 1: the GPU tests of the kernels whose placement changed, then plain decode under
#          LINGC_PDL_TRIGGER=late (the reference of the same call).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 190 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --modes lingc,lingc-nextn --tokens 48 --profile --out "$OUT/s" 2>&1 | stamp > "$OUT/decode_small.log"
 cp "$OUT/s/decode.json" "$OUT/decode_small.json"; rm -rf "$OUT/s") &
(CUDA_VISIBLE_DEVICES=1 timeout 80 $PYT --timeout 60 --timeout-method thread tests/test_head_matmul.py \
    tests/test_mla_decode.py tests/test_mla_kv_write.py tests/test_norm_kernels.py tests/test_pdl_trigger.py 2>&1 \
    | stamp > "$OUT/pytest_gpu_mla_norms.log"
 LINGC_PDL_TRIGGER=late CUDA_VISIBLE_DEVICES=1 timeout 105 python3 -m benchmarks.decode --preset flash-tp4-rank \
    --context 8192 --lingc-inductor 0 --modes lingc --tokens 48 --profile --out "$OUT/l" 2>&1 | stamp > "$OUT/decode_late.log"
 cp "$OUT/l/decode.json" "$OUT/decode_late.json"; rm -rf "$OUT/l") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
