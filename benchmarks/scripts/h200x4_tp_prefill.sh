#!/usr/bin/env bash
# For a 4-GPU host (written in session 41, not yet run: no multi-GPU machine was lent; carry
# .whl, .triton_cache.tar.gz): captured prefill under tensor parallelism. GPUs 0-1: the 2-GPU tests (NCCL inside captured prefill and relay graphs,
# the prefill benchmark under torchrun) and the prefill graphs' single-GPU tests; GPUs 2-3 at the
# same time: flash-tp4-rank split two ways, captured against eager. Then all four GPUs: the full
# Ling-3.0-flash 4-way (the deployment of the source article), captured against eager.
set -u
DURATIONS=12 source "$(dirname "$0")/device_env.sh"
nvidia-smi -L | head -4
(CUDA_VISIBLE_DEVICES=0,1 timeout 330 $PYT --timeout 300 --timeout-method thread tests/test_tensor_parallel.py \
    tests/test_prefill_graphs.py tests/test_benchmark_smoke.py -k "tp2 or torchrun or prefill_graphs or captured" \
    2>&1 | stamp > "$OUT/pytest_tp.log") &
(CUDA_VISIBLE_DEVICES=2,3 timeout 300 torchrun --master-port 29533 --nproc-per-node 2 -m benchmarks.prefill --tp 2 \
    --preset flash-tp4-rank --tokens 1024 4096 8192 --reps 5 --out "$OUT/p2" 2>&1 | stamp > "$OUT/prefill_tp2.log"
 mv "$OUT/p2/prefill_tp2.json" "$OUT/prefill_tp2.json"; rm -rf "$OUT/p2") &
wait
tail -3 "$OUT/pytest_tp.log"; grep -E "FAILED|Error" "$OUT/pytest_tp.log" | head -20
grep -E "tokens, (captured|eager)|captured in|per rank" "$OUT/prefill_tp2.log" | cut -c9- | head -20
timeout 240 torchrun --master-port 29544 --nproc-per-node 4 -m benchmarks.prefill --tp 4 --preset flash \
    --tokens 1024 3000 4096 8192 --reps 5 --out "$OUT/p4" 2>&1 | stamp > "$OUT/prefill_tp4.log"
mv "$OUT/p4/prefill_tp4.json" "$OUT/prefill_tp4.json"; rm -rf "$OUT/p4"
grep -E "tokens, (captured|eager)|captured in|per rank|Error" "$OUT/prefill_tp4.log" | cut -c9- | head -30
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
