#!/usr/bin/env bash
# Session 47, call 1 (carry .whl, .triton_cache.tar.gz; timeout_s 590, ~450 s expected):
# 1. the GPU tests of what sessions 46-47 built on the CPU: the norm kernels' file whole
#    (zero-centred gain, silu gate), the KDA chain's per-head-gate and GPU tests, the grouped-head
#    (Qwen3-Next) kernel file whole, the foreign model's Qwen3-Next / GDN GPU decode tests;
# 2. the README table's lingc rows (plain and relay, speculative == plain) at this commit: on an
#    H200 they replace session 44's; on an H100 they compare with session 46's H100 runs only.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s47_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_norm_kernels.py tests/test_kda_grouped_heads.py 2>&1 | stamp > "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py -k "per_head or gpu" 2>&1 | stamp >> "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_foreign_model.py 2>&1 | stamp >> "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -10
nvidia-smi --query-gpu=name --format=csv,noheader
table_modes decode_flash-tp4-rank_s47_c1 lingc,lingc-nextn 220
grep -E "^ *[0-9.]+ \| lingc|speculative|equal|identical|copy band" "$OUT/decode_flash-tp4-rank_s47_c1.log" \
    | cut -c9- | head -12
rm -f "$OUT/decode_flash-tp4-rank_s47_c1.png"
save_triton_cache
