#!/usr/bin/env bash
# Session 23 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): benchmarks.tma_probe, TMA
# (tensor-descriptor) weight streaming against the lingc GEMM's table config and a pure read of
# the same cold bytes, fused KDA projection / KDA o_proj / fused MLA at M = 1 and 6. Nothing in
# the library uses TMA yet; this says whether the GEMM should.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m benchmarks.tma_probe --out "$OUT/t" 2>&1 | stamp > "$OUT/tma_probe.log"
sed -n '/| shape/,$p' "$OUT/tma_probe.log"; tail -3 "$OUT/tma_probe.log"
cp "$OUT/t/tma_probe.json" "$OUT/tma_probe.json" 2>/dev/null; rm -rf "$OUT/t"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
