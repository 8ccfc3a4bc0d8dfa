#!/usr/bin/env bash
# Session 26 call 2 on ONE H200 (carry .whl and .triton_cache.tar.gz from call 1): every kernel
# micro-benchmark of the issues on the current code WITH its Inductor column, which none of them
# had measured on a GPU before (skinny GEMMs, KDA, attention; the MoE layer's default and
# max-autotune Inductor in call 3), the SwiGLU GEMM (issue 3's table, last measured 2026-11-29),
# and the pure-read chains of session 25's profiled steps (read_probe --step, fixed after call 1)
# plus single pure reads of the issues' target shapes (2.0 MB shared expert, 5.2 MB o_proj,
# 15.7 MB dense MLP, 26.3 MB fused KDA projection).
# Expected ~400 s; run with timeout_s 590. At most eight files come back: one log, JSONs.
set -u
source "$(dirname "$0")/device_env.sh"
LOG=$OUT/kernels.log
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_benchmark_smoke.py -k "kda_inductor or read_probe" 2>&1 \
    | stamp > "$OUT/pytest_c2.log"
tail -1 "$OUT/pytest_c2.log"; grep -E "^FAILED" "$OUT/pytest_c2.log" | head
for mode in lingc lingc-nextn; do
    CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.read_probe --out "$OUT/rp_$mode" --chunk-kb 16 32 \
        --step benchmarks/results/decode_table_s25_c1.json --mode $mode 2>&1 | stamp | tee -a "$LOG"
    cp "$OUT/rp_$mode/read_probe_step.json" "$OUT/read_probe_step_$mode.json"; rm -rf "$OUT/rp_$mode"
done
echo "=== read_probe --mb" | tee -a "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.read_probe --out "$OUT/rp" --mb 2.0 5.2 15.7 26.3 \
    --chunk-kb 16 32 2>&1 | stamp | tee -a "$LOG"
rm -rf "$OUT/rp"
run_bench() {   # NAME LIMIT ARGS...
    local name=$1 limit=$2; shift 2
    echo "=== $name: $*" | tee -a "$LOG"
    CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 -m benchmarks.$name --out "$OUT/k" "$@" 2>&1 \
        | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp >> "$LOG"
    echo "    exit ${PIPESTATUS[0]}" | tee -a "$LOG"
}
run_bench kernels_swiglu 60 --all-shapes
run_bench kernels_kda 100 --inductor
run_bench kernels_attn 150
run_bench kernels_gemm 180 --inductor
cat "$OUT/pytest_c2.log" >> "$LOG"; rm -f "$OUT/pytest_c2.log"
for f in "$OUT"/k/*.json; do cp "$f" "$OUT/"; done; rm -rf "$OUT/k"
grep -E "^ *[0-9.]+ \| " "$LOG" | grep -E "lingc \||inductor|eager" | head -80
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
