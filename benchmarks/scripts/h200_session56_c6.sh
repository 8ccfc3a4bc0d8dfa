#!/usr/bin/env bash
# Session 56 call 6 (carry .whl; timeout_s ~450): the sampled verify's cost as users get it, with
# Inductor compiling what lingc's passes leave (--lingc-inductor 1, the backend's default: the
# draw's softmax, scans and pointwise ops fused; call 4 ran them as ATen kernels).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 1 --modes lingc-nextn --tokens 16 --sampled-verify --out "$OUT/d" 2>&1 | stamp > "$OUT/decode.log"
cp "$OUT/d/decode.json" "$OUT/decode_sampled_inductor.json"; rm -rf "$OUT/d"
grep -E "^\S*\s*\| lingc|verify_sample|greedy output|per graph|Error" "$OUT/decode.log" | head -12
