#!/usr/bin/env bash
# Session 26 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): calls 2-3's two failed
# checks again, after their fixes: kernels_attn (Inductor's MLA 7.7e-4 - 9.7e-4 from the
# reference against a tolerance of 1e-4 meant for lingc's kernel; now 2e-3 for that baseline)
# and kernels_moe with both Inductor modes (max-autotune at T = 6 was checked under the eager
# router's picks, rel RMS 0.16; now each compiled layer is checked under its own routing).
# Expected ~300 s (call 3: MoE 226 s; call 2: attention ~45 s); run with timeout_s 590.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:cacheprovider -q --tb=short \
    tests/test_benchmark_smoke.py -k "routed_wrapper" 2>&1 | tail -2
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.kernels_attn --out "$OUT/k" 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp > "$OUT/kernels_attn.log"
echo "attn exit ${PIPESTATUS[0]}"
CUDA_VISIBLE_DEVICES=0 timeout 380 python3 -m benchmarks.kernels_moe --out "$OUT/k" --inductor default max-autotune 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | grep -v "^ *triton_mm\|^ *strides\|^ *dtypes" \
    | stamp > "$OUT/kernels_moe.log"
echo "moe exit ${PIPESTATUS[0]}"
cp "$OUT"/k/*.json "$OUT/" 2>/dev/null; rm -rf "$OUT/k"
grep -E "^ *[0-9.]+ \| .*(lingc|inductor|eager) \||FAILED|floor" "$OUT/kernels_attn.log" "$OUT/kernels_moe.log" | head -60
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
