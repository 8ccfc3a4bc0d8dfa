#!/usr/bin/env bash
# For the next session lent an H200 (carry .whl, .triton_cache.tar.gz). Session 46 was lent H100s
# only: the [V, K] KDA states (dac152a) were measured there, not on the README table's GPU. Here:
# the README table's lingc rows on an H200 at this commit (plain and relay, speculative == plain),
# then session 41's KDA prefill segments a second time (session 46's H100 call: 4 segments -16% a
# layer at 8192 tokens in the kernel benchmark, the whole captured prefill -7 ms at 4096 tokens and
# level at 1024 and 8192; set the table's segments only if this call agrees).
# First the GPU check of what session 46 built after its device time was spent (CPU-tested only):
# the per-head (Gated DeltaNet) gate of the KDA chain, the silu-gated head norm, the zero-centred
# norm in embedding_rmsnorm: the norm kernels' test file whole and the KDA kernel's per-head tests.
# Expected ~480 s; run with timeout_s 590.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_norm_kernels.py 2>&1 | stamp > "$OUT/pytest_s47.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_kernel.py -k "per_head or gpu" 2>&1 | stamp >> "$OUT/pytest_s47.log"
grep -E "passed|failed" "$OUT/pytest_s47.log"; grep -E "FAILED" "$OUT/pytest_s47.log" | head -10
table_modes decode_flash-tp4-rank_h200_s47 lingc,lingc-nextn 220
grep -E "^ *[0-9.]+ \| lingc|speculative|equal|identical|copy band" "$OUT/decode_flash-tp4-rank_h200_s47.log" \
    | cut -c9- | head -12
rm -f "$OUT/decode_flash-tp4-rank_h200_s47.png"
TAG=h200_s47 SKIP_TEST_FILE=1 bash "$(dirname "$0")/h200_session41_c4.sh"
