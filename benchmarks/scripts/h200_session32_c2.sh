#!/usr/bin/env bash
# Session 32 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = the commit before
# the norm pair): NEXTN's enorm + hnorm + their concatenation as one lingc.rmsnorm_pair_cols
# (pdl_glue.norm_pairs_into_concat: three launches -> one in each draft forward and in extend),
# A/B in one call: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile, 32
# tokens) on the baseline, then on this checkout; the relay with NEXTN's eh_proj on two design-B
# configs; then the GPU tests of the norms, the concatenations and the relay gates.
# Expected ~420 s; run with timeout_s 560.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 130 lingc,lingc-nextn 32
decode_as 0 decode_head 130 lingc,lingc-nextn 32
# NEXTN's eh_proj (N 2560, K 5120, 26 MB; run 4x a draft graph and once in extend) on design B
# (the whole K chunk loaded before the PDL wait) instead of the table's A(64, 4): relay only.
for v in "b64x10w8:_b(64, 10, num_warps=8)" "b64x20:_b(64, 20)"; do
    PRELUDE="import lingc.runtime.kernels.gemm.config as C; C.CONFIGS[(2560, 5120)] = C.${v#*:}; print('eh_proj', C.CONFIGS[(2560, 5120)])" \
        decode_as 0 "decode_eh_${v%%:*}" 120 lingc-nextn 32
done
for f in decode_base decode_head decode_eh_b64x10w8 decode_eh_b64x20; do
    echo "== $f"; grep -E "^ *[0-9.]+ \| lingc|greedy|copy band|eh_proj" "$OUT/$f.log" | tail -5; done
for v in b64x10w8 b64x20; do echo "== decode_eh_$v"; cat "$OUT/decode_eh_$v.log"; rm "$OUT/decode_eh_$v.log"; done \
    > "$OUT/decode_eh.log"     # (the device tool returns at most eight files)
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_norm_kernels.py tests/test_concat_cols.py tests/test_concat_into.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_pair.log"
tail -2 "$OUT/pytest_gpu_pair.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_pair.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
