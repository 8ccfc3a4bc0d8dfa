#!/usr/bin/env bash
# Session 11, call 2 (nvidia-h200-x2; carry .whl and .triton_cache.tar.gz from call 1):
#   GPU 0: lingc plain + relay with the Triton cache call 1 packed (compile + capture, warm);
#   GPU 1: Inductor reduce-overhead at T=1 and the relay's forwards under it (reduce-overhead-nextn).
set -u
source "$(dirname "$0")/device_env.sh"
(decode_as 0 decode_warm 420 lingc,lingc-nextn 48) &
(CUDA_VISIBLE_DEVICES=1 timeout 500 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --tokens 16 --modes reduce-overhead,reduce-overhead-nextn --out "$OUT/ind" 2>&1 | stamp > "$OUT/decode_inductor.log";
 cp "$OUT/ind/decode.json" "$OUT/decode_inductor.json"; rm -rf "$OUT/ind") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
