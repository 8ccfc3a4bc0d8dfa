#!/usr/bin/env bash
# Session 38 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's prefill in the fp32
# expanded form (the default) against the new bf16 expanded form on flash attention, at 1024,
# 8192 and 32768 tokens in one process (logits of each against the first setting's); MLA's GPU tests.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --mla expanded expanded-bf16 --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_mla_s38_c4.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_mla_s38_c4.json"; rm -rf "$OUT/p"
grep -E "^ *[0-9.]+ +[0-9]+ tokens, (chunk|MoE)|Error|error" "$OUT/prefill_mla_s38_c4.log" | cut -c9- | cut -c1-330
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_mla.py tests/test_model.py 2>&1 | stamp > "$OUT/pytest_changed_s38_c4.log"
tail -2 "$OUT/pytest_changed_s38_c4.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c4.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
