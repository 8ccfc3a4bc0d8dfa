#!/usr/bin/env bash
# Session 45 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = cdd8cef, the
# session's start; `git archive --format=tar.gz -o .base.tar.gz cdd8cef`). Session 45 ran no GPU
# (the device was paused); everything it built is CPU-tested only. In order of what must hold:
#   1. Ling-3's KDA states stored [V, K] (lingc/models/cache.py): the model-level GPU tests
#      (relay gates: 256-token speculative == plain; batch invariance; the flash-tp4-rank chain
#      rows; prefill graphs; the KDA layer and chain tests);
#   2. A/B in one call, the README table's decode (flash-tp4-rank, context 8192, lingc plain and
#      relay, --profile, 32 tokens) on cdd8cef ([K, V] states) and on this checkout: the kernel
#      benchmark said 3.29 -> 3.03 us a layer at T = 1, 7.49 -> 6.83 staged at T = 6 (session 44);
#   3. the Llama-form norm kernels (rmsnorm_router, mla_kv_write, rmsnorm_pair_cols, rmsnorm_out,
#      gated_head_rmsnorm round_before_weight): their test files whole (unmarked sweeps included).
# Expected ~450 s; run with timeout_s 590.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_relay.py tests/test_batch_invariance.py tests/test_kda.py \
    tests/test_kda_kernel.py tests/test_prefill_graphs.py 2>&1 | stamp > "$OUT/pytest_gpu_s45_c1.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s45_c1.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s45_c1.log" | head -20
base_setup
BASE=1 decode_as 0 decode_base_s45_c1 150 lingc,lingc-nextn 32
decode_as 0 decode_head_s45_c1 150 lingc,lingc-nextn 32
for f in decode_base_s45_c1 decode_head_s45_c1; do
    grep -E "^ *[0-9.]+ \| lingc|greedy|speculative|copy band" "$OUT/$f.log" | cut -c9- | tail -5
done
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_rmsnorm_router.py tests/test_norm_kernels.py tests/test_mla_kv_write.py 2>&1 \
    | stamp >> "$OUT/pytest_gpu_s45_c1.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s45_c1.log" | tail -1; grep -E "FAILED" "$OUT/pytest_gpu_s45_c1.log" | head -10
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
