#!/usr/bin/env bash
# Session 54 call 2 (carry .whl, .triton_cache.tar.gz; timeout_s ~480): session 54's kernel and
# pass changes on the GPU: kda_chain and gated_head_rmsnorm reading head-grouped [T, A, B] views
# (kernel tests on CUDA: the grouped-heads file whole, the gated norm's, the KDA kernel's compile
# and grouped forms), gqa_decode's 16-bit output (out_dtype) and gate tests, the bf16 gated
# attention and Qwen3-Next model tests (-m gpu), head_cache_write and gqa_decode with the per-head
# norm in their loads (kernel tests on CUDA); then foreign_decode at both rank presets (the
# session-54 c1 run left 12 clones and the gate's three ops to Inductor at qwen3-next's).
set -u
DURATIONS=4 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s54_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_grouped_heads.py tests/test_norm_kernels.py tests/test_gqa_decode.py tests/test_head_cache_write.py \
    "tests/test_kda_kernel.py::test_kernel_compiles_for_sm90_without_spills" 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py tests/test_pdl_swap_gqa_rope.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
foreign_decode_as foreign_decode_s54_c2 qwen3-next-tp4-rank kimi-linear-tp4-rank
save_triton_cache
