#!/usr/bin/env bash
# Session 26 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the MoE layer benchmark
# with both Inductor columns the MoE issue asks for (default, max-autotune-no-cudagraphs), never
# run on a GPU before: issue 5's "at least 3x faster than Inductor's best at T = 6".
# Expected: unknown (max-autotune benchmarks its GEMM templates); run with timeout_s 590.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 540 python3 -m benchmarks.kernels_moe --out "$OUT/k" --inductor default max-autotune 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp > "$OUT/kernels_moe.log"
echo "exit ${PIPESTATUS[0]}"
cp "$OUT"/k/*.json "$OUT/" 2>/dev/null; rm -rf "$OUT/k"
grep -E "^ *[0-9.]+ \| |floor|Inductor|graphs" "$OUT/kernels_moe.log" | head -40
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
