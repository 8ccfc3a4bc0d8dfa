#!/usr/bin/env bash
# Session 32 call 2b on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = a1f9291, the
# commit before the norm pair): call 2 cut to the device time left after its refusals. The relay
# (flash-tp4-rank, context 8192, --profile, 32 tokens) on the baseline, on this checkout (NEXTN's
# enorm + hnorm + concatenation as one lingc.rmsnorm_pair_cols), and with NEXTN's eh_proj on
# design B (64 rows, 10 K chunks, 8 warps); then the GPU tests of the norms and the relay gates.
# Expected ~300 s; run with timeout_s 420.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
BASE=1 decode_as 0 decode_base 100 lingc-nextn 32
decode_as 0 decode_head 100 lingc-nextn 32
PRELUDE="import lingc.runtime.kernels.gemm.config as C; C.CONFIGS[(2560, 5120)] = C._b(64, 10, num_warps=8); print('eh_proj', C.CONFIGS[(2560, 5120)])" \
    decode_as 0 decode_eh_b64x10w8 100 lingc-nextn 32
for f in decode_base decode_head decode_eh_b64x10w8; do
    echo "== $f"; grep -E "^ *[0-9.]+ \| lingc|greedy|copy band|eh_proj" "$OUT/$f.log" | tail -4; done
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_norm_kernels.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu_pair.log"
tail -2 "$OUT/pytest_gpu_pair.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_pair.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
