#!/usr/bin/env bash
# Session 52 call 2 (carry .whl, .triton_cache.tar.gz; timeout_s ~420): gqa_decode's first timing
# (benchmarks.kernels_attn, gqa only: a Qwen3-Next rank's 4 over 1 heads of 256 at 8192 / 65536,
# T 1 and 6, against SDPA eager and Inductor, the floor beside), then benchmarks.foreign_decode at
# kimi-linear-tp4-rank and qwen3-next-tp4-rank (now with Qwen3-Next's gated attention on gqa_decode).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --no-norms --no-mla --out "$OUT/attn" \
    2>&1 | stamp > "$OUT/kernels_attn_gqa_s52_c2.log"
mv "$OUT/attn/kernels_attn.json" "$OUT/kernels_attn_gqa_s52_c2.json" 2>/dev/null; rm -rf "$OUT/attn"
grep -E "gqa_decode|FAILED|Error" "$OUT/kernels_attn_gqa_s52_c2.log" | head -20
for preset in kimi-linear-tp4-rank qwen3-next-tp4-rank; do
    name=foreign_decode_s52_c2_${preset%%-tp4-rank}
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.foreign_decode --preset $preset \
        --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
    mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
    grep -E "^\S*\s*\|| agree|bandwidth|Error" "$OUT/$name.log" | tail -6
done
save_triton_cache
