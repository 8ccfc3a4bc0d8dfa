#!/usr/bin/env bash
# Session 16 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz):
#   1. decode, plain + relay: the KDA chain at one warp (this checkout's table) against four warps
#      (the former table, set by a prelude), same call;
#   2. plain decode with the relay tail and the embedding fold off (prelude): call 2 saw the
#      projection GEMMs +50 us on HEAD against 47b8469 in either order;
#   3. every single-GPU test file (the one-warp chain changes the chain's bits).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
decode_as 0 d_w1 150 lingc,lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.kda.kernel as K; K.CONFIGS[(8, 128, 128)] = K.KdaConfig(bv=8, num_warps=4)" \
    decode_as 0 d_w4 150 lingc,lingc-nextn 48
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_relay_tail = False; PdlSwap.fold_embedding = False" \
    decode_as 0 d_nofold 100 lingc 48
grep -E "^ *[0-9.]+ \| lingc|by kind|KDA" "$OUT"/d_*.log | grep -v "^.*kernels" 
CUDA_VISIBLE_DEVICES=0 timeout 240 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
