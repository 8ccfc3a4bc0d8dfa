#!/usr/bin/env bash
# Runs on commit f511ab8 (release_at_last_token was removed after this call).
# Session 28 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz). Call 1: the KDA chain at one
# warp is faster alone (T = 6 staged 6.75 against 8.81 us, fla-core 11.22) and in plain decode
# (KDA 145 -> 128 us critical), but slower in the verify graph (322 -> 337 us), where its
# successors (the gated head norm, then o_proj streaming its weight) are released right after the
# chain's wait and share the SMs with it for the whole six-token chain. Does releasing them at
# the chain's last token (KdaConfig.release_at_last_token, timing only) change that?
#   1. test_kda_kernel.py's gpu-marked tests (the late release keeps the bits);
#   2. kernels_kda at T = 1 and 6, BV 8 at 1 and 4 warps, each with and without the late release;
#   3. the decode step, plain and relay, profiled: the table, one warp + late release, four warps
#      + late release (preludes), one process each, same GPU.
# Expected ~420 s; run with timeout_s 590.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_kda_kernel.py 2>&1 | stamp > "$OUT/pytest_kda_gpu.log"
tail -1 "$OUT/pytest_kda_gpu.log"; grep -E "^FAILED|Error" "$OUT/pytest_kda_gpu.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.kernels_kda --t 1 6 --bv 8 --warps 1 4 --release-last \
    --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_kda.log"
cp "$OUT"/k/*.json "$OUT/kernels_kda.json"; rm -rf "$OUT/k"
grep -E "lingc \||bv.-w|fla" "$OUT/kernels_kda.log"
decode_as 0 decode_table 120 lingc,lingc-nextn 32
for w in 1 4; do
PRELUDE="
from lingc.runtime.kernels.kda import kernel as _K
_K.CONFIGS[(8, 128, 128)] = _K.KdaConfig(bv=8, num_warps=$w, release_at_last_token=True)
print('kda table:', _K.CONFIGS[(8, 128, 128)])
" decode_as 0 decode_kda_w${w}_last 120 lingc,lingc-nextn 32
done
for n in decode_table decode_kda_w1_last decode_kda_w4_last; do echo "== $n"; grep -E "^ *[0-9.]+ \| lingc|greedy output|_kda_chain" "$OUT/$n.log" | head -8; done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
