#!/usr/bin/env bash
# Session 40 call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz): after the shared prefill pool,
# the captured-prefill and relay GPU tests (the 256-token gates run through the engine's prefill
# graphs), and the KDA prefill scratch test with its chunk-64 walk on 4 warps.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 240 $PYT --timeout 200 --timeout-method thread tests/test_prefill_graphs.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_changed.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kda_prefill.py -k scratch 2>&1 \
    | stamp >> "$OUT/pytest_changed.log"
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_changed.log" | tail -8
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
