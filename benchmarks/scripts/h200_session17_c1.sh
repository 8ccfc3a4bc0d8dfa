#!/usr/bin/env bash
# Prepared at the end of session 16 for the next session's first call on ONE H200 (carry .whl,
# .triton_cache.tar.gz, and .base.tar.gz = `git archive --format=tar.gz -o .base.tar.gz a0ca68c`,
# the commit before the pair layout):
#   1. every single-GPU test file on this checkout: the pair layout of the MoE experts (4fc03b8,
#      515c416: no moe_align launch for 2..16 tokens) and the router logits' chunked form
#      (LOGITS_ROWS = 8, not the default) have run only under the Triton interpreter and ptxas;
#   2. the MoE layer alone at T = 1 and 6: pair layout against [align] (--set table), and the
#      router at 1, 2 and 8 rows per reduction (--set router);
#   3. decode, plain + relay: a0ca68c (BASE=1) against this checkout, in one call.
# Ran on 465b5d0 (session 17 call 1). The pair layout and the chunked router logits it timed were
# removed after calls 1-4 (results/README.md, session 17): a record, it does not run on later commits.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 240 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
for set in table router; do
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.moe_sweep --out "$OUT/moe" --set $set --layers 40 \
        2>&1 | stamp >> "$OUT/moe_sweep.log"
    cp "$OUT/moe/moe_sweep_flash-tp4-rank.json" "$OUT/moe_sweep_$set.json"
    rm -rf "$OUT/moe"
done
base_setup
BASE=1 decode_as 0 decode_base 130 lingc,lingc-nextn 48
decode_as 0 decode_head 130 lingc,lingc-nextn 48
grep -E "\| [16] \|" "$OUT/moe_sweep.log"
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind" "$OUT"/decode_*.log
# At most 8 files come back: the JSON in one archive.
(cd "$OUT" && tar czf json.tar.gz ./*.json && rm -f ./*.json)
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
