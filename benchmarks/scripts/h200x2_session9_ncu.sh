#!/usr/bin/env bash
# Session 9, call 5, on a 2-GPU H200 host (nvidia-h200-x2): WHY the fused KDA projection GEMM
# (62% of copy bandwidth in the chain) and the router's selection (3.5 us for one warp's work)
# take what they take: Nsight Compute's speed-of-light, memory, warp-state (stall reasons),
# scheduler, occupancy and launch sections for the first twelve `_gemm_kernel` /
# `_moe_router_select_kernel` nodes of one captured decode step (layers 0-3: the fused KDA
# projection, the KDA o_proj, the dense MLP's down projection, the selection), caches flushed
# before each (ncu's default), no PDL overlap.
#   GPU 1: ncu over `python -m benchmarks.ncu_step --roles decode` (the decode benchmark's step);
#   GPU 0: flash-tp4-rank decode (context 8192, lingc plain, --profile) of this checkout again,
#          a second sample of the run-to-run spread.
set -u
source "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
(CUDA_VISIBLE_DEVICES=1 timeout 400 "$NCU" --profile-from-start off --graph-profiling node \
    --kernel-name regex:"_gemm_kernel|_moe_router_select_kernel" --launch-count 12 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --csv --page details --print-units base \
    --log-file "$OUT/ncu_detail.csv" python3 -m benchmarks.ncu_step --roles decode --out "$OUT/n" 2>&1 \
    | stamp > "$OUT/ncu_run.log"; rm -rf "$OUT/n"; gzip -f "$OUT/ncu_detail.csv") &
decode_as 0 decode_again 150 lingc 48 &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
