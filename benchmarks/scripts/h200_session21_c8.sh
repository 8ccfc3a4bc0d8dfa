#!/usr/bin/env bash
# Session 21 call 8 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split at 4 warps with
# 64-row tiles and 2 stages (two programs per SM) in a decode step at 8192, against the table.
# Call 7 (kernels_attn, us per call): T = 1 14.0 -> 14.8, T = 6 26.4 -> 21.4; at 65536 it loses.
set -u
source "$(dirname "$0")/device_env.sh"
W4="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as M
_table = M.config_for
M.config_for = lambda *a: (lambda c: dataclasses.replace(c, num_stages=2, num_warps=4) if c.split_len <= 128 else c)(_table(*a))"
PRELUDE="$W4" decode_as 0 decode_w4 160 lingc,lingc-nextn 48
decode_as 0 decode_table 160 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_mla_split|_mla_combine" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
