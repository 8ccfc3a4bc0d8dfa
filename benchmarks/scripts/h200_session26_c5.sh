#!/usr/bin/env bash
# Session 26 call 5 on ONE H200 (carry .whl): the decode benchmark's sanity lines against
# method.md with the T = 6 verify's distinct-expert count printed under its floor-bytes line
# (added after call 1, whose verify floor was 6.543 GB against method.md's 7.1), from the cheapest
# mode (eager, 4 tokens): the floors and their expert counts do not depend on the modes run.
# Then benchmarks.gather_probe (added after the call was refused): the routed MoE up-GEMM's tiles
# read with nothing computed, adding the id indirection, the id read after the PDL wait and the
# split-K epilogue one at a time, beside a contiguous pure read of the same bytes.
# Expected ~100 s after the install; run with timeout_s 300.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --tokens 4 --modes eager --out "$OUT/d" 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp > "$OUT/sanity.log"
cp "$OUT/d/decode.json" "$OUT/sanity.json"; rm -rf "$OUT/d"
grep -E "floor|method.md|distinct|eager" "$OUT/sanity.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.gather_probe --out "$OUT/g" 2>&1 | stamp | tee "$OUT/gather_probe.log"
cp "$OUT/g/gather_probe.json" "$OUT/"; rm -rf "$OUT/g"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
