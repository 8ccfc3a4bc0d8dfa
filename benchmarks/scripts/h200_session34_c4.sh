#!/usr/bin/env bash
# Session 34 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split layout from whole
# 64-row tiles (config_for: ~100-128 splits at any capacity past 16384, where the power-of-two
# rule gave the benchmark's capacities 65 splits). The MLA kernel tests on the GPU, then call 3's
# three contexts again (its numbers are the baseline: same session, same command).
# Expected ~60 + 3 x 95 s; run with timeout_s 520.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -p no:cacheprovider -q --tb=short tests/test_mla_decode.py \
    2>&1 | stamp > "$OUT/pytest_mla_s34_c4.log"
tail -2 "$OUT/pytest_mla_s34_c4.log"
for ctx in 32768 65536 131072; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.decode --preset flash-tp4-rank --context $ctx \
        --lingc-inductor 0 --tokens 32 --modes lingc,lingc-nextn --out "$OUT/c$ctx" 2>&1 \
        | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
        | stamp > "$OUT/context_${ctx}_s34_c4.log"
    cp "$OUT/c$ctx/decode.json" "$OUT/context_${ctx}_s34_c4.json"; rm -rf "$OUT/c$ctx"
    grep -E "^ *[0-9.]+ \| lingc|greedy|copy bandwidth" "$OUT/context_${ctx}_s34_c4.log" | tail -4
done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
