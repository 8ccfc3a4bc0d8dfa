#!/usr/bin/env bash
# Session 58 call 2 (carry .whl .triton_cache.tar.gz; timeout_s ~480): sampled_targets with the early
# decision (a row's nucleus fixed once its digit's bin holds one token): the GPU tests of the op, of
# both engines' and DecodeRunner's sampled graphs; the micro-benchmark and the passes under the
# profiler; the decode step's sampled graphs at top_p 1 and 0.9 against greedy's.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_sampled_targets.py tests/test_decode_runner.py tests/test_relay_sampling.py \
    "tests/test_spec_runner.py::test_gpu_captured_relay_equals_plain_without_a_host_sync[kimi-style-fp32]" 2>&1 | stamp > "$OUT/pytest_s58_c2.log"
grep -E "passed|failed" "$OUT/pytest_s58_c2.log"; grep -E "^\S*\s*(FAILED|E )" "$OUT/pytest_s58_c2.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 50 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 1 6 --vocab 39296 \
    --replays 10 2>&1 | stamp > "$OUT/sampling.log"
grep -E "\|" "$OUT/sampling.log"
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 benchmarks/scripts/probe_sampled_passes.py --profile 2>&1 | stamp >> "$OUT/sampling.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/scripts/probe_sampled_passes.py --sweep 2>&1 | stamp >> "$OUT/sampling.log"
grep -E "rows=" "$OUT/sampling.log" | cut -c1-400
lingc_decode 0 160 --sampled-verify --sampled-top-p 1 0.9
grep -E "^\S*\s*\| lingc|_sample|greedy output|Error" "$OUT/decode.log" | head -10
# The main job's sampled request on the GPU (not run on a GPU before): plain and speculative.
CUDA_VISIBLE_DEVICES=0 timeout 80 python3 -m lingc run --preset tiny --temperature 0.8 --top-p 0.9 2>&1 | stamp \
    > "$OUT/run_sampled.log"
grep -vE "^\s*[0-9.]+ *$|\[#|Warning|warn" "$OUT/run_sampled.log" | tail -14
save_triton_cache
ls "$OUT"
