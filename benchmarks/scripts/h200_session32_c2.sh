#!/usr/bin/env bash
# Session 32 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = the commit before
# the norm pair): NEXTN's enorm + hnorm + their concatenation as one lingc.rmsnorm_pair_cols
# (pdl_glue.norm_pairs_into_concat: three launches -> one in each draft forward and in extend),
# A/B in one call: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile, 32
# tokens) on the baseline, then on this checkout; then the GPU tests of the norms, the
# concatenations and the relay gates.
# Expected ~330 s; run with timeout_s 500.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 32
decode_as 0 decode_head 150 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *[0-9.]+ \| lingc|greedy|copy band" "$OUT/$f.log" | tail -5; done
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_norm_kernels.py tests/test_concat_cols.py tests/test_concat_into.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_pair.log"
tail -2 "$OUT/pytest_gpu_pair.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_pair.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
