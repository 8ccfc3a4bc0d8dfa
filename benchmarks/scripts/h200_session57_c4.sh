#!/usr/bin/env bash
# Session 57 call 4 (carry .whl; timeout_s ~330): after the histogram fix (two tf32 products at
# SUB = 256 instead of Triton's tf32x3 at 512, which spilled: 32 registers, 9 KB of stack): the
# passes alone, the GPU tests of the sampling op and of both engines' sampled graphs, the
# micro-benchmark, and the decode step with the sampled graphs (as call 2).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 benchmarks/scripts/probe_sampled_passes.py 2>&1 | stamp | grep -E "rows=|regs" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_sampled_targets.py tests/test_relay_sampling.py tests/test_spec_runner.py 2>&1 | stamp > "$OUT/pytest_s57_c4.log"
grep -E "passed|failed" "$OUT/pytest_s57_c4.log"; grep -E "^\S*\s*(FAILED|E )" "$OUT/pytest_s57_c4.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 1 6 --vocab 39296 \
    --replays 10 2>&1 | stamp > "$OUT/kernels_sampling.log"
grep -E "\|" "$OUT/kernels_sampling.log"
lingc_decode 0 150 --sampled-verify
grep -E "_sample|greedy output|Error" "$OUT/decode.log" | head -6
