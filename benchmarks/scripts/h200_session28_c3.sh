#!/usr/bin/env bash
# Session 28 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA chain's T = 6 verify
# took 8.81 us in call 1 and 7.46 in call 2 with the same binary (fla-core 11.22 / 11.32). Which
# machine, at which clocks? benchmarks.common now records nvidia-smi's view of the GPU in every
# JSON (gpu_state); this call also samples SM clock and power every second (nvidia-smi dmon)
# while kernels_kda runs twice at T = 1 and 6 (table config, fla-core beside it).
# Expected ~150 s; run with timeout_s 400.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 60 $PYT tests/test_gpu_state.py 2>&1 | tail -2
nvidia-smi -q -i 0 -d CLOCK,PERFORMANCE,POWER > "$OUT/nvidia_smi_q.log" 2>&1
nvidia-smi dmon -i 0 -s pc -d 1 > "$OUT/dmon.log" 2>&1 &
DMON=$!
for run in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.kernels_kda --t 1 6 --out "$OUT/k$run" 2>&1 \
        | stamp > "$OUT/kernels_kda_$run.log"
    cp "$OUT"/k$run/*.json "$OUT/kernels_kda_$run.json"; rm -rf "$OUT/k$run"
    grep -E "\| lingc \||fla" "$OUT/kernels_kda_$run.log"
done
kill $DMON
python3 -c "import json; print(json.load(open('$OUT/kernels_kda_1.json'))['environment'])"
grep -E "Clocks Event|Throttle|SM  |Graphics|Power Draw|Current Power Limit" "$OUT/nvidia_smi_q.log" | head -20
cat "$OUT/kernels_kda_2.log" >> "$OUT/kernels_kda_1.log"; rm "$OUT/kernels_kda_2.log"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
