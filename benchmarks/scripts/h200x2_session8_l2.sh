#!/usr/bin/env bash
# Session 8, call 3, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: the L2 prefetch probe (benchmarks/l2_prefetch_probe.py), 6 and 12 us spins;
#   GPU 1: flash-tp4-rank decode, lingc plain and relay, --profile, late trigger, with the fused
#          KDA projection on design B (B bn64 sk5, 8 warps: whole chunk before the wait).
set -u
source "$(dirname "$0")/device_env.sh"
(for s in 6 12; do CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.l2_prefetch_probe --spin-us $s --out "$OUT/p$s" 2>&1 \
    | stamp > "$OUT/l2_probe_$s.log"; cp "$OUT/p$s/l2_prefetch_probe.json" "$OUT/l2_probe_$s.json"; rm -rf "$OUT/p$s"; done) &
(CUDA_VISIBLE_DEVICES=1 timeout 240 python3 -c "import lingc.runtime.kernels.gemm.config as c
c.CONFIGS[(5128, 2560)] = c._b(64, 5, 8)
from benchmarks.decode import main
raise SystemExit(main(['--preset', 'flash-tp4-rank', '--context', '8192', '--lingc-inductor', '0',
                       '--modes', 'lingc,lingc-nextn', '--tokens', '48', '--profile', '--out', '$OUT/d']))" 2>&1 | stamp > "$OUT/decode_late_kdaB.log"
 cp "$OUT/d/decode.json" "$OUT/decode_late_kdaB.json"; rm -rf "$OUT/d") &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
