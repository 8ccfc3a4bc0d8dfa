#!/usr/bin/env bash
# Runs on commit 05894b6 (down_sums_partials and its probe were removed after these calls).
# Session 27 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): does summing the routed
# up-GEMM's split-K partials in the down-GEMM (MoeExpertsConfig.down_sums_partials: no release
# fence and ticket at the end of every up-GEMM CTA; call 1's gather probe put the split-K
# epilogue at +2.7 us of a T = 6 layer's read) pay?
#   1. test_moe_experts.py's gpu-marked tests (the summing config is among the same-bits ones);
#   2. moe_sweep --set sum at T = 1 and 6 (the table, then the summing down-GEMM at four tiles,
#      each checked bit for bit against the table);
#   3. the decode step, plain and relay, profiled, on the table and on the summing config (the
#      first sweep variant, 128 columns x 8 warps), one process each, same GPU.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_moe_experts.py 2>&1 | stamp > "$OUT/pytest_moe_gpu.log"
tail -1 "$OUT/pytest_moe_gpu.log"; grep -E "^FAILED|Error" "$OUT/pytest_moe_gpu.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.moe_sweep --set sum --t 1 6 --out "$OUT/s" 2>&1 \
    | stamp > "$OUT/moe_sweep_sum.log"
cp "$OUT"/s/*.json "$OUT/moe_sweep_sum.json"; rm -rf "$OUT/s"
grep -E "\| (1|6) \||best" "$OUT/moe_sweep_sum.log"
decode_as 0 decode_table 150 lingc,lingc-nextn 32
PRELUDE="
import dataclasses
from lingc.runtime.kernels.moe_experts import kernel as _K
_K.CONFIGS[(192, 2560)] = dataclasses.replace(_K.CONFIGS[(192, 2560)], down_sums_partials=True, down_warps=8)
print('down_sums_partials:', _K.CONFIGS[(192, 2560)])
" decode_as 0 decode_sum 150 lingc,lingc-nextn 32
for n in decode_table decode_sum; do echo "== $n"; grep -E "^ *[0-9.]+ \| lingc|greedy output" "$OUT/$n.log"; done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
