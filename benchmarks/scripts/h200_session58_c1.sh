#!/usr/bin/env bash
# Session 58 call 1 (carry .whl .triton_cache.tar.gz .base.tar.gz = `git archive 0610388`; timeout_s ~480):
# the README table's lingc rows at HEAD (32 tokens, the README's command) on whichever GPU came; then
# sampled_targets with its histogram products batched a warp each (this session) against 0610388's:
# the GPU tests of the op, the passes alone, and the micro-benchmark of both commits.
set -u
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
table_modes table_lingc lingc,lingc-nextn 300
grep -E "^\S*\s*\||speculative|bandwidth|Error" "$OUT/table_lingc.log" | head -16
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_sampled_targets.py 2>&1 | stamp > "$OUT/pytest_s58_c1.log"
grep -E "passed|failed" "$OUT/pytest_s58_c1.log"; grep -E "^\S*\s*(FAILED|E )" "$OUT/pytest_s58_c1.log" | head -8
CUDA_VISIBLE_DEVICES=0 timeout 40 python3 benchmarks/scripts/probe_sampled_passes.py 2>&1 | stamp > "$OUT/sampling.log"
grep -E "rows=|regs" "$OUT/sampling.log" | head -12
CUDA_VISIBLE_DEVICES=0 timeout 50 python3 -m benchmarks.kernels_sampling --out "$OUT" --rows 1 6 --vocab 39296 \
    --replays 10 2>&1 | stamp > "$OUT/sampling_head.log"
grep -E "\|" "$OUT/sampling_head.log"
base_setup
cd /tmp/base/run && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH timeout 50 python3 -m \
    benchmarks.kernels_sampling --out /tmp/base/o --rows 1 6 --vocab 39296 --replays 10 2>&1 | stamp \
    > "$OUT/sampling_base.log"; cd - > /dev/null
grep -E "\|" "$OUT/sampling_base.log"

# DecodeRunner's sampling on a captured step (this session): its GPU test with the rest of the file.
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_decode_runner.py 2>&1 | stamp > "$OUT/pytest_s58_c1b.log"
grep -E "passed|failed" "$OUT/pytest_s58_c1b.log"; grep -E "^\S*\s*(FAILED|E )" "$OUT/pytest_s58_c1b.log" | head -8
save_triton_cache
# At most eight files come back: one pytest log, one sampling log.
cat "$OUT/pytest_s58_c1b.log" >> "$OUT/pytest_s58_c1.log"; rm -f "$OUT/pytest_s58_c1b.log"
cat "$OUT/sampling_head.log" "$OUT/sampling_base.log" >> "$OUT/sampling.log"; rm -f "$OUT"/sampling_{head,base}.log
ls "$OUT"
