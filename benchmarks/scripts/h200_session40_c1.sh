#!/usr/bin/env bash
# Session 40 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the captured prefill's GPU tests
# and the engine's (relay gates included), then prefill captured against eager at 1024, 3000 (a
# padded bucket: 3072 rows), 8192 and 32768 tokens in one process.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 240 --timeout-method thread tests/test_prefill_graphs.py \
    tests/test_relay.py tests/test_benchmark_smoke.py tests/test_reference_decoding.py tests/test_decode_checkpoint.py \
    2>&1 | stamp > "$OUT/pytest_changed.log"
tail -2 "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
PREFILL_TOKENS="1024 3000 8192 32768" PREFILL_LIMIT=240 prefill_as prefill_s40_c1
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
