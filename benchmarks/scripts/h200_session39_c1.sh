#!/usr/bin/env bash
# Session 39 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the prompt MoE's expert GEMMs
# on lingc::moe_grouped. The GPU tests of the changed files; the kernels' sweep against the library
# grouped form (benchmarks.kernels_moe_grouped, one flash-tp4-rank MoE layer at 1024 and 8192
# tokens); prefill with both grouped forms in one process, and a profile of the new one.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_moe_grouped.py tests/test_moe_swiglu.py tests/test_moe.py \
    tests/test_model.py 2>&1 | stamp > "$OUT/pytest_changed_s39_c1.log"
tail -2 "$OUT/pytest_changed_s39_c1.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s39_c1.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_moe_grouped --tokens 1024 8192 \
    --block-m 64 128 --block-n 32 64 --up-warps 4 8 --up-stages 4 --block-h 64 128 256 --down-warps 4 8 \
    --down-stages 3 --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_moe_grouped_s39_c1.log"
mv "$OUT/k/kernels_moe_grouped.json" "$OUT/kernels_moe_grouped_s39_c1.json"; rm -rf "$OUT/k"
grep -E "tokens|copy" "$OUT/kernels_moe_grouped_s39_c1.log" | cut -c9- | head -80
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped-library grouped --profile 8192 --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c1.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c1.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|kind|MoE |KDA |GPU busy" "$OUT/prefill_s39_c1.log" | cut -c9- | head -40
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
