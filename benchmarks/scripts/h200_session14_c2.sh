#!/usr/bin/env bash
# Session 14, call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = a2fb8f0):
#   1. GPU tests of the router kernels, batch invariance and the relay's exactness;
#   2. the selection probe (bitonic top-k against the repeated-max loop, 1/2/4 warps; the logits
#      kernel with 1/2/4/8 token rows per pass);
#   3. flash-tp4-rank decode (plain and relay, --profile): this checkout with LOGITS_ROWS 1 and 4,
#      then a2fb8f0 (the loop selection) on the same GPU.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
base_setup
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_moe_kernels.py \
    tests/test_batch_invariance.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python3 benchmarks/scripts/probe_select_topk.py "$OUT/probe_select_topk.json" \
    2>&1 | stamp > "$OUT/probe_select_topk.log"
decode_as 0 decode_topk 150 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.moe_router.kernel as rk; rk.LOGITS_ROWS = 4" \
    decode_as 0 decode_topk_rows4 150 lingc,lingc-nextn 48
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 48
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
