#!/usr/bin/env bash
# Session 25 call 1 on ONE H200 (carry .whl; .triton_cache.tar.gz if this checkout has one):
# every single-GPU test file's gpu-marked tests on the session's first commit (session 24's
# mla_kv_write latent norm, the new model-shape tests and the norm tests' device fix have not
# run together on a GPU), norm_kernels in full (session 24 call 5's 41 cross-device failures,
# fixed after it), then a profiled plain + relay decode: the session's reference.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:cacheprovider -q --tb=short tests/test_norm_kernels.py \
    2>&1 | stamp > "$OUT/pytest_norm_kernels_full.log"
tail -1 "$OUT/pytest_norm_kernels_full.log"
decode_as 0 decode_table 165 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound" "$OUT"/decode_table.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
