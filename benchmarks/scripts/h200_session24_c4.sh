#!/usr/bin/env bash
# Session 24 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's kv_a_layernorm inside
# lingc.mla_kv_write (pdl_glue.norms_into_kv_writes, PdlSwap.fold_kv_norm). The mla_kv_write
# kernel tests on the GPU (all of them: they are not gpu-marked), the MLA decode and relay GPU
# tests (the 256-token speculative == plain gate with the fold), then decode plain + relay with
# the fold, then without it (prelude), in this call.
set -u
DURATIONS=3 source "$(dirname "$0")/device_env.sh"
{ CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:cacheprovider -q tests/test_mla_kv_write.py 2>&1
  CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_mla_decode.py tests/test_relay.py 2>&1; } \
    | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed" "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode_fold 130 lingc,lingc-nextn 48
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_kv_norm = False" \
    decode_as 0 decode_nofold 130 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|chain bound|_mla_kv_write|_rmsnorm_kernel|layer chains" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
