#!/usr/bin/env bash
# Session 31 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = cfc328d, the
# session's start): the relay's chain positions read by the MLA kernels from n and an offset
# (pdl_glue.positions_into_readers: no iota + add kernels at the head of each step graph), A/B in
# one call: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile, 32 tokens) on
# the baseline, then on this checkout; then the GPU tests of the MLA kernels, the glue and the
# relay gates; the Triton cache of what ran, for call 3.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 170 lingc,lingc-nextn 32
decode_as 0 decode_head 170 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *[0-9.]+ \| lingc|greedy|copy band" "$OUT/$f.log" | tail -5; done
CUDA_VISIBLE_DEVICES=0 timeout 170 $PYT tests/test_mla_decode.py tests/test_mla_kv_write.py tests/test_pdl_glue.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_positions.log"
tail -2 "$OUT/pytest_gpu_positions.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_positions.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
