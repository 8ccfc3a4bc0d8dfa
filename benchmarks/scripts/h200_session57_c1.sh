#!/usr/bin/env bash
# Session 57 call 1 (carry .whl; timeout_s ~560): the speculative-sampling kernel (lingc.sampled_targets:
# the nucleus by a radix search, four PDL passes) with the GPU tests of the relay, speculative
# sampling, SpecRunner, DecodeRunner and the prefill graphs (also the check of session 56's review
# commit), then its micro-benchmark against the ATen reference (and Inductor at 39296).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s57_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    --durations=8 tests/test_sampled_targets.py tests/test_relay_sampling.py tests/test_spec_runner.py \
    tests/test_prefill_graphs.py tests/test_relay.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 4 6 --vocab 39296 \
    --inductor 2>&1 | stamp > "$OUT/kernels_sampling.log"
mv "$OUT/kernels_sampling.json" "$OUT/kernels_sampling_39296.json" 2>/dev/null
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 4 6 --vocab 157184 \
    2>&1 | stamp >> "$OUT/kernels_sampling.log"
grep -E "^\S*\s*\|" "$OUT/kernels_sampling.log"; grep -iE "error|failed" "$OUT/kernels_sampling.log" | head
