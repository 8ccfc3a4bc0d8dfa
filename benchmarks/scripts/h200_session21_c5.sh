#!/usr/bin/env bash
# Session 21 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): WHY MLA's split kernel takes
# ~13 us a program at context 8192 (2 tiles of 64 cache rows; call 4: a 32-row query tile costs
# 5.4 us more at T = 1 and a T = 6 chain at 2 programs a split takes as long as at 3, so a
# program's time grows with its query rows, not with the cache bytes). Nsight Compute's
# speed-of-light, compute, memory, warp-state (stall reasons), scheduler, occupancy and
# instruction sections on the second split launch at T = 1 and at T = 6, caches flushed.
set -u
source "$(dirname "$0")/device_env.sh"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
CUDA_VISIBLE_DEVICES=0 timeout 300 "$NCU" --kernel-name regex:"_mla_split_kernel" --launch-skip 1 --launch-count 3 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section InstructionStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv --page details --print-units base --log-file "$OUT/ncu_mla_split.csv" \
    python3 benchmarks/scripts/mla_split_ncu_run.py 2>&1 | stamp > "$OUT/ncu_run.log"
tail -5 "$OUT/ncu_run.log"
python3 - "$OUT/ncu_mla_split.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keys = ("Duration", "Registers Per Thread", "Achieved Occupancy", "Compute (SM) Throughput", "Memory Throughput",
        "DRAM Throughput", "Issue Slots Busy", "Executed Ipc Active", "No Eligible", "Warp Cycles Per Issued Instruction",
        "Stall", "stalled", "Executed Instructions", "Pipe")
def small(v):
    try:
        return float(v.replace(",", "")) < 0.05
    except ValueError:
        return False
for r in rows:
    if any(k in r["Metric Name"] for k in keys) and not ("stalled" in r["Metric Name"] and small(r["Metric Value"])):
        print(r["ID"], r["Grid Size"], r["Metric Name"], r["Metric Value"], r["Metric Unit"])
PY
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
