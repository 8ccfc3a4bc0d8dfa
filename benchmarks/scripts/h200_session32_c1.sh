#!/usr/bin/env bash
# Session 32 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = 70a3d92, the
# session's start): the relay graphs' last ATen kernels on lingc ops (verify: the final norm
# writes relay.vhid itself, lingc.rmsnorm_out; draft: the chain's cat + copy as one
# lingc.concat_into), A/B in one call: flash-tp4-rank decode (context 8192, lingc plain and
# relay, --profile, 32 tokens) on the baseline, then on this checkout; then the GPU tests of the
# two ops, the glue and the relay gates; the Triton cache of what ran.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 170 lingc,lingc-nextn 32
decode_as 0 decode_head 170 lingc,lingc-nextn 32
for f in decode_base decode_head; do grep -E "^ *[0-9.]+ \| lingc|greedy|copy band" "$OUT/$f.log" | tail -5; done
CUDA_VISIBLE_DEVICES=0 timeout 170 $PYT tests/test_concat_into.py tests/test_norm_kernels.py tests/test_pdl_glue.py \
    tests/test_relay.py tests/test_relay_advance.py 2>&1 | stamp > "$OUT/pytest_gpu_tail.log"
tail -2 "$OUT/pytest_gpu_tail.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_tail.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
