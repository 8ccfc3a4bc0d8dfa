#!/usr/bin/env bash
# Session 8, call 6, on a 2-GPU H200 host (nvidia-h200-x2): the "small" PDL trigger placement
# (the norms release their dependents before their wait; every other kernel after).
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain and relay, --profile) with
#          LINGC_PDL_TRIGGER=late, then small;
#   GPU 1: every single-GPU test file under LINGC_PDL_TRIGGER=small, then plain decode under small
#          with the fused KDA projection on design B (B bn64 sk5, 8 warps).
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
decode() {  # decode GPU NAME LIMIT MODES [env...] : log + JSON as NAME
    local gpu=$1 name=$2 limit=$3 modes=$4; shift 4
    env CUDA_VISIBLE_DEVICES=$gpu "$@" timeout "$limit" python3 -c "${PRELUDE:-}
from benchmarks.decode import main
raise SystemExit(main(['--preset', 'flash-tp4-rank', '--context', '8192', '--lingc-inductor', '0',
                       '--modes', '$modes', '--tokens', '48', '--profile', '--out', '$OUT/$name']))" 2>&1 | stamp > "$OUT/$name.log"
    cp "$OUT/$name/decode.json" "$OUT/$name.json"; rm -rf "$OUT/$name"
}
(decode 0 decode_late 230 lingc,lingc-nextn LINGC_PDL_TRIGGER=late
 decode 0 decode_small 230 lingc,lingc-nextn LINGC_PDL_TRIGGER=small) &
(CUDA_VISIBLE_DEVICES=1 LINGC_PDL_TRIGGER=small timeout 330 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu_small.log"
 PRELUDE="import lingc.runtime.kernels.gemm.config as c
c.CONFIGS[(5128, 2560)] = c._b(64, 5, 8)" decode 1 decode_small_kdaB 120 lingc LINGC_PDL_TRIGGER=small) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
