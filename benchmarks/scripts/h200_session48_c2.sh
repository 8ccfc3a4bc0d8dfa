#!/usr/bin/env bash
# Session 48, call 2 (carry .whl, .triton_cache.tar.gz; timeout_s ~540): call 1's failures after
# their fixes (the 4-column cache's shifted-out column not carried out of the token loop; the
# probe's outputs left on the GPU by a region that moves its zeros there; fla's gated delta rule
# called with beta in gk's place), the grouped-head chain's micro-benchmark, then the single-GPU
# test files' GPU tests, those two first.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s48_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_grouped_heads.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED" "$LOG" | head -10
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_gdn --out "$OUT/gdn" 2>&1 \
    | grep -v "UserWarning\|warnings.warn" | stamp > "$OUT/kernels_gdn.log"
cp "$OUT/gdn/kernels_gdn.json" "$OUT/kernels_gdn.json" 2>/dev/null; rm -rf "$OUT/gdn"
grep -E "^ *[0-9.]+ \|" "$OUT/kernels_gdn.log" | cut -c9- | head -14
CUDA_VISIBLE_DEVICES=0 timeout "${TESTS_LIMIT:-200}" $PYT --timeout 120 --timeout-method thread tests/ \
    --ignore=tests/test_tensor_parallel.py --ignore=tests/test_kda_grouped_heads.py \
    --ignore=tests/test_foreign_model.py --deselect tests/test_benchmark_smoke.py::test_gpu_kernels_gdn_runs_and_checks \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
save_triton_cache
