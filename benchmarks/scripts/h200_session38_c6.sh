#!/usr/bin/env bash
# Session 38 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = d7c4756, the
# session's start): time to first token at 1024, 8192 and 32768 tokens with everything of this
# session (prompt chunk 8192, moe_select, the prompt kernels, MLA in bf16, the 2-part KDA walk),
# this commit / d7c4756 / this commit in one call; the GPU tests of the changed files.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
prefill_as prefill_new_s38_c6
prefill_as prefill_base_s38_c6 base
prefill_as prefill_new2_s38_c6
CUDA_VISIBLE_DEVICES=0 timeout 220 $PYT tests/test_kda_prefill_inputs.py tests/test_kda_prefill.py tests/test_model.py \
    tests/test_mla.py tests/test_moe.py tests/test_moe_combine.py tests/test_moe_kernels.py \
    tests/test_benchmark_smoke.py::test_gpu_prefill_benchmark_runs_both_moe_forms \
    tests/test_benchmark_smoke.py::test_gpu_kernels_kda_prefill_sweeps_splits_and_times_a_baseline 2>&1 | stamp > "$OUT/pytest_changed_s38_c6.log"
tail -2 "$OUT/pytest_changed_s38_c6.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c6.log" | head
cat "$OUT"/prefill_new2_s38_c6.log >> "$OUT/prefill_new_s38_c6.log"; rm -f "$OUT/prefill_new2_s38_c6.log"
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
