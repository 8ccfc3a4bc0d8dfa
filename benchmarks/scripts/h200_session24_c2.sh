#!/usr/bin/env bash
# Session 24 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): a layer's input norm inside
# its fused projection GEMM (lingc.rmsnorm_gemm, pdl_glue.norms_into_gemms, PdlSwap.fold_gemm_norm).
# The rmsnorm_gemm / gemm / relay GPU tests (the 256-token speculative == plain gate with the
# fold), then decode plain + relay with the fold, then without it (prelude), in this call.
set -u
DURATIONS=3 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_rmsnorm_gemm.py tests/test_gemm.py \
    tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_fold 130 lingc,lingc-nextn 48
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_gemm_norm = False" \
    decode_as 0 decode_nofold 130 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound|_gemm_kernel|_rmsnorm_kernel|layer chains" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
