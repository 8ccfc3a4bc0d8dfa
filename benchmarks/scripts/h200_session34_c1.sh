#!/usr/bin/env bash
# Session 34 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the test files this session
# changed, run on the GPU: rmsnorm_router and head_matmul whole (their kernel sweeps on the GPU),
# the up-GEMV cases of moe_experts, the relay's gpu-marked gates.
# Expected ~240 s; run with timeout_s 420.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s34_c1.log
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -p no:cacheprovider -q --tb=short --durations=5 \
    tests/test_rmsnorm_router.py tests/test_head_matmul.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m pytest -p no:cacheprovider -q --tb=short \
    tests/test_moe_experts.py -k up_gemv 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_relay.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
