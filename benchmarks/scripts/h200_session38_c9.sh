#!/usr/bin/env bash
# Session 38 call 9 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA prefill kernel after the
# walk's refactor into helpers (same table: 2 parts, 4 warps) at H = 8 and 32, T = 8192, against
# call 5's figures; the kernel's GPU tests and the router's.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
for H in 8 32; do
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_kda_prefill --t 8192 --heads $H \
        --out "$OUT/k$H" 2>&1 | stamp > "$OUT/kda_prefill_h${H}_s38_c9.log"
    rm -rf "$OUT/k$H"
    grep -E "^ *[0-9.]+ \| 8192" "$OUT/kda_prefill_h${H}_s38_c9.log" | cut -c9- | cut -c1-200
done
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_kda_prefill.py tests/test_moe_kernels.py -k "gpu" \
    2>&1 | stamp > "$OUT/pytest_changed_s38_c9.log"
tail -2 "$OUT/pytest_changed_s38_c9.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c9.log" | head
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
