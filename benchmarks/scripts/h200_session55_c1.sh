#!/usr/bin/env bash
# Session 55 call 1 (carry .whl; timeout_s ~200): what a split-K GEMM's in-launch ticket
# reduction costs a PDL chain of decode projections, against handing the fp32 partials to the
# consumer (benchmarks.split_defer_probe: a KDA layer's fused projection and o_proj, 35 cold
# layers, T = 1, 2, 6; the deferred chain's bits are checked against the ticket chain first).
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.split_defer_probe --t 1 2 6 --replays 40 \
    --out "$OUT/probe" 2>&1 | stamp > "$OUT/split_defer_probe_s55_c1.log"
mv "$OUT/probe/split_defer_probe.json" "$OUT/split_defer_probe_s55_c1.json" 2>/dev/null; rm -rf "$OUT/probe"
tail -20 "$OUT/split_defer_probe_s55_c1.log"
