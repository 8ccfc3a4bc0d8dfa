#!/usr/bin/env bash
# Session 20 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split out of the PDL
# chain at long contexts (config_for's split_pdl, chosen from the kernel pair alone in session 19)
# in a decode step at context 65536: the former rule (the split always in the chain, through a
# config_for override) against the table's, plain and relay, in one call.
set -u
source "$(dirname "$0")/device_env.sh"
OLD_RULE="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as M
_table = M.config_for
M.config_for = lambda *a: dataclasses.replace(_table(*a), split_pdl=True)"
CONTEXT=65536 PRELUDE="$OLD_RULE" decode_as 0 decode_65536_split_pdl 170 lingc,lingc-nextn 48
CONTEXT=65536 decode_as 0 decode_65536_table 170 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_mla_split|_mla_combine" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
