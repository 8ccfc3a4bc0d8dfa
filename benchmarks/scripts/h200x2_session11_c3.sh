#!/usr/bin/env bash
# Session 11, call 3 (nvidia-h200-x2; carry .whl, .triton_cache.tar.gz): where lingc's compile +
# capture time goes on the device host: cProfile of Engine.prepare for the relay's roles (GPU 0)
# and for plain decode (GPU 1), flash-tp4-rank, warm Triton cache.
set -u
source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 400 python3 benchmarks/scripts/profile_compile.py --out "$OUT" \
    > "$OUT/profile_relay.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 400 python3 benchmarks/scripts/profile_compile.py --roles decode --out "$OUT" \
    > "$OUT/profile_decode.log" 2>&1) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
