#!/usr/bin/env bash
# Session 22 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): the router logits launch with
# its token rows split over row groups (`ROW_GROUPS`, programs per expert block; the same bits).
# Verify's logits took 4.5 us a layer at T = 6 against 1.5 at T = 1: one program per expert
# block walks the six rows one after another. Router GPU tests, the router sweep at T = 1 2 6 8,
# then the relay (T = 1 has one row group whatever the setting, so plain decode is not rerun)
# at 1, 2, 3 and 6 row groups.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_moe_kernels.py tests/test_pdl_trigger.py -k "router or trigger" \
    2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -10
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.moe_sweep --set router --t 1 2 6 8 --out "$OUT/m" \
    2>&1 | stamp > "$OUT/moe_sweep_router.log"
grep -E "\| (1|2|6|8) \| router" "$OUT/moe_sweep_router.log"; rm -rf "$OUT/m"
for g in 1 2 3 6; do
    PRELUDE="import lingc.runtime.kernels.moe_router.kernel as R; R.ROW_GROUPS = $g" \
        decode_as 0 decode_relay_g$g 110 lingc-nextn 48
done
grep -E "^ *[0-9.]+ \| lingc|greedy output|_moe_router_logits" "$OUT"/decode_relay_g*.log
# The device tool returns at most eight files: the four JSONs travel as one archive.
tar czf "$OUT/decode_relay_json.tgz" -C "$OUT" decode_relay_g1.json decode_relay_g2.json decode_relay_g3.json \
    decode_relay_g6.json && rm -f "$OUT"/decode_relay_g*.json
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
