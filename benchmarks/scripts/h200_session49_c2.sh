#!/usr/bin/env bash
# Session 49 call 2 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = `git archive 6647f2c`;
# timeout_s ~560): the gated shared expert (moe_experts' shared_sigmoid, Qwen3-Next's MoE block
# in the foreign model) and the bias-less router on the GPU: the moe_experts test file whole
# (its unmarked kernel tests run on the GPU too), the router's no-bias tests, the foreign model's
# GPU tests; then plain decode at 6647f2c against this commit in one call (the down-GEMM gained
# arguments; Ling-3's combine is constexpr-unchanged), then the relay's GPU gates.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s49_c2.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_experts.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_moe_kernels.py tests/test_rmsnorm_router.py -k "bias" 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
base_setup
BASE=1 decode_as 0 decode_base_s49_c2 110 lingc 32
decode_as 0 decode_head_s49_c2 110 lingc 32
for f in base head; do grep -E "^\s*[0-9.]+ \| lingc |per graph ms" "$OUT/decode_${f}_s49_c2.log" | tail -2; done
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_relay.py 2>&1 | stamp >> "$LOG"
tail -1 "$LOG"
save_triton_cache
