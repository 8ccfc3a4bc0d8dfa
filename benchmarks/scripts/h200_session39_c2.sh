#!/usr/bin/env bash
# Session 39 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): the grouped MoE without its
# bincount sync; prefill with both grouped forms in one process, with the host's issue time and
# the synchronising calls of each run; the GPU tests of the changed files.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped-library grouped --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c2.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c2.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|host:" "$OUT/prefill_s39_c2.log" | cut -c9- | head -40
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_moe_grouped.py tests/test_moe.py tests/test_benchmark_smoke.py \
    -k "grouped or prefill" 2>&1 | stamp > "$OUT/pytest_changed_s39_c2.log"
tail -2 "$OUT/pytest_changed_s39_c2.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s39_c2.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
