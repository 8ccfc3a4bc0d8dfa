#!/usr/bin/env bash
# Session 33 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1): the MLA split's
# L2 prefetch before its PDL wait (MlaDecodeConfig.l2_prefetch) against the table config, plain
# decode and the relay, profiled, 32 tokens, one process each; then the MLA kernel GPU tests
# (the prefetch's bits among them) and the README table's lingc rows if time is left.
# Expected ~2 x 80 + 60 s; run with timeout_s 400.
# Ran on 253eeae; the prefetch was removed after the call (benchmarks/results/
# mla_split_l2_prefetch_s33_c3.patch applies it again).
set -u
source "$(dirname "$0")/device_env.sh"
PRE="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as K
_cf = K.config_for
K.config_for = lambda *a: dataclasses.replace(_cf(*a), l2_prefetch=True)
print('l2_prefetch', K.config_for(8192, 8, 512, 64))"
decode_as 0 decode_base_s33_c3 140 lingc,lingc-nextn 32
PRELUDE="$PRE" decode_as 0 decode_pref_s33_c3 150 lingc,lingc-nextn 32
for f in base pref; do grep -E "per graph ms|greedy|l2_prefetch" "$OUT/decode_${f}_s33_c3.log" | tail -4; done
CUDA_VISIBLE_DEVICES=0 timeout 80 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_gpu_mla.log"
tail -2 "$OUT/pytest_gpu_mla.log"
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
