#!/usr/bin/env bash
# Session 23 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): lingc.rmsnorm_router (the MoE
# block's input norm done by the router's logits kernel; pdl_glue.norms_into_routers, one launch
# less per MoE layer), built and CPU-tested this session. Every single-GPU test file on the
# commit, then decode plain + relay with the fold (the table) and without it
# (PdlSwap.fold_router_norm = False by a prelude), one after the other in this call.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 300 $PYT --timeout 240 --timeout-method thread \
    tests/ --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_fold 150 lingc,lingc-nextn 48
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_router_norm = False" \
    decode_as 0 decode_nofold 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound|_moe_router_logits|_rmsnorm_kernel" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
