#!/usr/bin/env bash
# Session 25 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the three tests call 2 found
# wrong on the GPU, as fixed, then the README table's first half on one machine (issue 8: at most
# three calls of 8 minutes on one warm machine): eager, the eager relay, Inductor reduce-overhead
# and its relay forwards, lingc plain and relay, in one process, 32 tokens, no profiling (the
# table's command). Call 4 runs the rest (Inductor default, reduce-overhead + enable_pdl).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -p no:cacheprovider -q --tb=short \
    "tests/test_mla_decode.py::test_kernel_inside_the_models_layer" \
    "tests/test_moe_kernels.py::test_router_block_e_does_not_change_bits" \
    "tests/test_moe_experts.py::test_split_k_reduction_never_elected_is_caught" 2>&1 | stamp > "$OUT/pytest_fixed.log"
tail -3 "$OUT/pytest_fixed.log"
table_modes() {   # NAME MODES LIMIT
    CUDA_VISIBLE_DEVICES=0 timeout "$3" python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
        --lingc-inductor 0 --tokens 32 --modes "$2" --out "$OUT/$1" 2>&1 \
        | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
        | stamp > "$OUT/$1.log"
    cp "$OUT/$1/decode.json" "$OUT/$1.json"; cp "$OUT/$1/decode.png" "$OUT/$1.png" 2>/dev/null; rm -rf "$OUT/$1"
}
table_modes table_a eager,eager-nextn,reduce-overhead,reduce-overhead-nextn,lingc,lingc-nextn 470
grep -E "^ *[0-9.]+ \| |greedy output|CUDA graphs|copy bandwidth" "$OUT/table_a.log"
grep -qiE "error" "$OUT/install.log" 2>/dev/null || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
