#!/usr/bin/env bash
# Session 17 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): after the pair layout and the
# chunked router logits were removed (the kernels are a0ca68c's again),
#   1. the MoE, router and PDL-trigger GPU tests on this checkout;
#   2. decode, plain + relay, with --profile: each layer's chain against its floor
#      (benchmarks.layer_chains: the attention issue's whole-layer target), per graph.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT --timeout 120 --timeout-method thread tests/test_moe_experts.py \
    tests/test_moe_kernels.py tests/test_pdl_trigger.py tests/test_layer_chains.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
decode_as 0 decode 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains" "$OUT"/decode.log
for g in "lingc decode" "lingc-nextn verify" "lingc-nextn draft" "lingc-nextn extend"; do
    set -- $g
    python3 -m benchmarks.layer_chains "$OUT/decode.json" --mode "$1" --graph "$2" 2>&1 | tee -a "$OUT/layer_chains.log"
done
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
