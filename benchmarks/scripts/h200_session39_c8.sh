#!/usr/bin/env bash
# Session 39 call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz): the grouped MoE's pairs grouped
# by lingc::moe_group_pairs (a counting sort, two launches) instead of torch.sort + searchsorted +
# the combine's inverse scatter. GPU tests of the changed files and the relay's gates; prefill with
# both grouped forms (reps 5) and a profile at 8192 tokens.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 240 --timeout-method thread tests/test_moe_grouped.py \
    tests/test_moe_combine.py tests/test_moe.py tests/test_model.py tests/test_relay.py \
    2>&1 | stamp > "$OUT/pytest_changed_s39_c8.log"
tail -2 "$OUT/pytest_changed_s39_c8.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s39_c8.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped-library grouped --reps 5 --profile 8192 --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c8.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c8.json"; rm -rf "$OUT/p"
grep -E "tokens, chunk|host:|GPU busy|^ *[0-9.]+   [A-Za-z]" "$OUT/prefill_s39_c8.log" | cut -c9- | head -30
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
