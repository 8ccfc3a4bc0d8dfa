#!/usr/bin/env bash
# Runs on commit 3c4c7c6 (MlaDecodeConfig.pack_lo and its kernel were removed after this call).
# Session 29 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz). MLA's split with one query a
# program and its hi and lo halves as the two row halves of one 16-row tile
# (MlaDecodeConfig.pack_lo, _mla_split_packed_kernel): half the MMAs of a decode's split program
# (the table's 16 rows hold two queries, half empty at T = 1, and take hi and lo as two dots);
# a verify chain runs twice the programs with half the MMAs each. sm_90 compile (CPU machine):
# 98 registers against 155, 68 MMAs a warp against 132, no spills.
#   1. test_mla_decode.py's gpu-marked tests (pack_lo against the reference and batch invariant);
#   2. kernels_attn, MLA only, T = 1 and 6 at 8192 and 65536, the table and --other-split;
#   3. the decode step, plain and relay, profiled: the table, then config_for with pack_lo (prelude),
#      one process each, same GPU.
# Expected ~360 s; run with timeout_s 500 (the session's device time left).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 120 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_mla_gpu.log"
tail -1 "$OUT/pytest_mla_gpu.log"; grep -E "^FAILED|Error" "$OUT/pytest_mla_gpu.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -m benchmarks.kernels_attn --no-inductor --no-norms --other-split \
    --t 1 6 --context 8192 65536 --out "$OUT/k" 2>&1 | stamp > "$OUT/kernels_attn.log"
cp "$OUT"/k/*.json "$OUT/kernels_attn.json"; rm -rf "$OUT/k"
grep -E "\| lingc \||pack-lo" "$OUT/kernels_attn.log"
decode_as 0 decode_table 110 lingc,lingc-nextn 32
PRELUDE="
import dataclasses
from lingc.runtime.kernels.mla_decode import kernel as _M
_cf = _M.config_for
_M.config_for = lambda *a: dataclasses.replace(_cf(*a), pack_lo=True)
print('mla config:', _M.config_for(8192, 8, 512, 64))
" decode_as 0 decode_mla_pack 110 lingc,lingc-nextn 32
for n in decode_table decode_mla_pack; do echo "== $n"; grep -E "^ *[0-9.]+ \| lingc|greedy output|mla config" "$OUT/$n.log" | head -6; done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
