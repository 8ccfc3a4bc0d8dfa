#!/usr/bin/env bash
# Session 51 call 2 (carry .whl, .triton_cache.tar.gz; timeout_s ~300; for the next session with a
# device): benchmarks.foreign_decode, tests/foreign_model.py at a Kimi-Linear-48B and a
# Qwen3-Next-80B TP4 rank's widths (three layers each), eager against lingc.DecodeRunner's captured
# step, the floor beside, the greedy tokens compared.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
for preset in kimi-linear-tp4-rank qwen3-next-tp4-rank; do
    name=foreign_decode_h100_s51_c2_${preset%%-tp4-rank}
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.foreign_decode --preset $preset \
        --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
    mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
    grep -E "^\S*\s*\|| agree|bandwidth" "$OUT/$name.log" | tail -6
done
save_triton_cache
