#!/usr/bin/env bash
# Session 23 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA chain with
# KdaConfig.fused_reductions (two multi-operand reductions per token instead of four: 18 -> 12
# CTA barriers per token in the sm_90 binary; other roundings, batch invariant), built and
# CPU-tested in session 22 without a GPU. The KDA GPU tests (both configs), the KDA kernel
# micro-benchmark (the `lingc-fused` rows), then decode plain + relay on the table against the
# fused config by a prelude, in one call. Flip the table if it pays in the step.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_kda_kernel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.kernels_kda --t 1 6 --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_kda.log"
grep -E "\| lingc" "$OUT/kernels_kda.log"; rm -rf "$OUT/k"
FUSED="import dataclasses, lingc.runtime.kernels.kda.kernel as KK
KK.CONFIGS[(8, 128, 128)] = dataclasses.replace(KK.CONFIGS[(8, 128, 128)], fused_reductions=True)"
PRELUDE="$FUSED" decode_as 0 decode_kda_fused 150 lingc,lingc-nextn 48
decode_as 0 decode_table 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|_kda_chain" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
