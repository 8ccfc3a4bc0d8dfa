#!/usr/bin/env bash
# Where a decode step's time goes, on a 2-GPU H200 host (nvidia-h200-x2):
#   GPU 0: flash-tp4-rank decode, lingc plain and relay, with --profile (each kernel's time on the
#          critical path: end-to-end deltas in the captured graph's replays);
#   GPU 1: one replay of the decode and verify graphs under Nsight Compute (each kernel alone:
#          its own time, DRAM bytes, registers, occupancy), then the summary table.
set -u
source "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
lingc_decode 0 ${P0:-300} --profile &
(CUDA_VISIBLE_DEVICES=1 timeout ${P1:-420} $(python3 -m benchmarks.ncu_step --ncu-command --out "$OUT" | sed "s|^ncu |$NCU |") \
    2>&1 | stamp > "$OUT/ncu_run.log"
 python3 -m benchmarks.ncu_step --summarize "$OUT/ncu.csv" --out "$OUT" > "$OUT/ncu_summary.md" 2>&1
 rm -f "$OUT/ncu_roles.json"; gzip -f "$OUT/ncu.csv") &
wait
save_triton_cache; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
