#!/usr/bin/env bash
# Session 22 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): lingc::head_matmul (MLA's
# absorbed products) with its rows split over programs (ROW_GROUPS 8: each row of a chain its own
# program; the same bits). Verify's head_matmul took 3.8-4.8 us a call at T = 6 against 1.2-1.5
# at T = 1 (call 3). GPU tests of the kernel, PDL triggers and glue, batch invariance and the
# relay (speculative == plain), then the relay with ROW_GROUPS 8 against 1 in one call.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 130 $PYT tests/test_head_matmul.py tests/test_pdl_trigger.py tests/test_pdl_glue.py \
    tests/test_batch_invariance.py tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
decode_as 0 decode_relay_hm8 85 lingc-nextn 48
PRELUDE="import lingc.runtime.kernels.head_matmul.kernel as HM; HM.ROW_GROUPS = 1" \
    decode_as 0 decode_relay_hm1 85 lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|_head_matmul" "$OUT"/decode_relay_hm*.log
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
