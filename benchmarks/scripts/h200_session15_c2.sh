#!/usr/bin/env bash
# Session 15, call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): why MLA's split program takes
# ~13 us per layer at T = 1 (92.9 us critical per plain step over 7 layers, call 1) against a
# 2.2 us floor.
#   1. Nsight Compute on one `_mla_split_kernel` launch at T = 1 and one at T = 6 (context 8192,
#      flash-tp4-rank's 8 heads, the table's config): speed of light, compute and memory
#      workload, warp states, scheduler, occupancy, launch, instruction stats, source counters.
#   2. The attention micro-benchmark with configs that test the hypotheses: the hi/lo split of
#      the fp32 operands doubles the tensor-core work (exact_q / exact_p off), and 64 splits of
#      128 rows leave half the SMs idle at T = 1 (64-row splits: 128 programs).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
for T in 1 6; do
  CUDA_VISIBLE_DEVICES=0 timeout 150 "$NCU" --graph-profiling node --kernel-name regex:"_mla_split_kernel" \
      --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section InstructionStats --section SourceCounters --page details --print-units base \
      --log-file "$OUT/ncu_split_t$T.txt" python3 -m benchmarks.kernels_attn --out "$OUT/n$T" --t $T --context 8192 \
      --no-inductor --no-norms --replays 1 2>&1 | stamp | tail -5
  rm -rf "$OUT/n$T"
done
CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m benchmarks.kernels_attn --out "$OUT/a" --t 1 6 --context 8192 65536 \
    --no-inductor --no-norms \
    --mla-config 128,64,3,8,64,32,1,0 --mla-config 128,64,3,8,64,32,0,0 \
    --mla-config 64,64,2,8 --mla-config 64,64,2,8,64,32,1,0 --mla-config 64,64,2,8,64,32,0,0 \
    --mla-config 128,64,3,4,64,32,0,0 2>&1 | stamp > "$OUT/attn.log"
cp "$OUT"/a/*.md "$OUT"/ 2>/dev/null; cp "$OUT"/a/*.json "$OUT"/ 2>/dev/null; rm -rf "$OUT/a"
tail -40 "$OUT/attn.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
