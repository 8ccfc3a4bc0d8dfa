#!/usr/bin/env bash
# Session 47, call 2 (carry .whl, .triton_cache.tar.gz; timeout_s 560): call 1's failing GPU tests
# again after their fixes (the grouped-head file compared CPU and CUDA tensors; the foreign
# Qwen3-Next decode's zeros made on the host and moved), the grouped-head chain's micro-benchmark
# (benchmarks.kernels_gdn: Qwen3-Next-80B's per-GPU layer, lingc vs eager vs fla), then every
# single-GPU test file's GPU tests (the KDA kernel changed for every model: grouped heads, the
# 4-column window).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s47_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_grouped_heads.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py -k qwen3 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED" "$LOG" | head -10
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.kernels_gdn --out "$OUT/gdn" 2>&1 \
    | grep -v "UserWarning\|warnings.warn" | stamp > "$OUT/kernels_gdn.log"
cp "$OUT/gdn/kernels_gdn.json" "$OUT/kernels_gdn.json" 2>/dev/null; rm -rf "$OUT/gdn"
grep -E "^ *[0-9.]+ \|" "$OUT/kernels_gdn.log" | cut -c9- | head -12
[ "${RUN_ALL:-0}" = 1 ] && gpu_tests 230      # (session 47 ran it without: device time ran short)
save_triton_cache
