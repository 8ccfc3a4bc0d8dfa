#!/usr/bin/env bash
# Session 15, call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive
# of this commit): call 3 again after its failures: the cache-rows form needs <= 2 stages of
# 64-row tiles (3 need 252 KiB of shared memory), and the micro-benchmark now skips a config
# that does not fit instead of stopping.
# Runs from the archive (/tmp/mine), not the working tree, which held a helper's unfinished work.
#   1. the MLA GPU tests (both split forms);
#   2. the attention micro-benchmark: the table's form against cache-rows-as-M variants;
#   3. flash-tp4-rank decode, plain and relay: the table, then the table with the fastest exact
#      cache-rows-as-M variant of step 2 (prelude_mla_best.py), in the same call.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
mkdir -p /tmp/mine && tar xzf .base.tar.gz -C /tmp/mine && cd /tmp/mine
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_mla.log"
tail -3 "$OUT/pytest_mla.log"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.kernels_attn --out "$OUT/a" --t 1 6 --context 8192 65536 \
    --no-inductor --no-norms \
    --mla-config 128,64,2,8,64,32,1,1,1 --mla-config 128,64,2,4,64,32,1,1,1 --mla-config 128,32,3,8,64,32,1,1,1 \
    --mla-config 128,32,4,8,64,32,1,1,1 --mla-config 128,64,2,8,64,32,0,0,1 --mla-config 64,64,2,8,64,32,1,1,1 \
    2>&1 | stamp > "$OUT/attn.log"
cp "$OUT"/a/kernels_attn.json "$OUT"/attn_rm.json; rm -rf "$OUT/a"
grep -E "\| (1|6) \| lingc" "$OUT/attn.log"
decode_as 0 decode_table 190 lingc,lingc-nextn 48
MLA_JSON="$OUT/attn_rm.json" PRELUDE="exec(open('benchmarks/scripts/prelude_mla_best.py').read())" \
    decode_as 0 decode_rm 190 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|prelude|_mla_split|greedy output" "$OUT"/decode_*.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
