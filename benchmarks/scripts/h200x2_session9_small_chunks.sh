#!/usr/bin/env bash
# Session 9, call 7, on a 2-GPU H200 host (nvidia-h200-x2): the fused KDA projection (M = 1 and
# 6, cold) with design-B chunks of 8-16 KB per CTA, the size at which a chain of pure reads went
# fastest (benchmarks/read_probe.py, call 6), against the table's config. GPU 0 only.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 -c "
import benchmarks.gemm_sweep as s
from lingc.runtime.kernels.gemm.config import _b, config_for
s.candidates = lambda n, k: s._unique([config_for(n, k), _b(32, 10), _b(16, 5), _b(16, 10), _b(64, 10), _b(32, 5)])
raise SystemExit(s.main(['--shapes', 'KDA fused q/k/v/f/g/b', '--m', '1', '6', '--out', '$OUT/g']))" 2>&1 \
    | stamp > "$OUT/gemm_small_chunks.log"
cp "$OUT/g/"*.json "$OUT/" 2>/dev/null; rm -rf "$OUT/g"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
