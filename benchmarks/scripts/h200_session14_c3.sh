#!/usr/bin/env bash
# Session 14, call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the GPU tests of MLA decode
# (16- and 32-row query tiles), the relay's exactness and batch invariance on this checkout (the
# session's final kernels), then flash-tp4-rank decode (plain and relay, --profile) with the
# MLA query tile at 16 rows (the table) and at 32 rows (a PRELUDE wraps config_for).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_mla_decode.py \
    tests/test_relay.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
decode_as 0 decode_rows16 150 lingc,lingc-nextn 48
PRELUDE="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as mk
_cf = mk.config_for
mk.config_for = lambda *a: dataclasses.replace(_cf(*a), min_query_rows=32)" \
    decode_as 0 decode_rows32 170 lingc,lingc-nextn 48
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
