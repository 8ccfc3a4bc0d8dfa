#!/usr/bin/env bash
# Session 70 call 2 (carry .whl; ~6 min): call 1's ticket bound said the split-K GEMMs' tails cost
# ~110 us a plain step. Measured here: the split-K decode GEMMs as one-chunk configs of about the
# same CTA count (prelude_gemm_nosplit.py: thinner column blocks, no ticket), plain and relay with
# its speculative == plain check, against the table's plain (early_ticket now on), each its own
# process; the relay to compare with is call 1's (4.650 ms, early_ticket's process). NOSPLIT_MODES=lingc
# leaves the relay out (device time). Last, plain decode on the prelude's variant b (design A loops
# everywhere, other tiles and stages). The JSONs' kernel sequences give each shape's change.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
show() { echo "== $1"; grep -E "^\S*\s*\| lingc|greedy output|WRONG|Error|prelude|_gemm_kernel|_moe_up|chain bound|by kind" \
    "$OUT/$1.log" | cut -c1-200 | head -14; }
NOSPLIT="import sys; sys.path.insert(0, 'benchmarks/scripts'); import prelude_gemm_nosplit"
decode_as 0 plain_table 110 lingc 32; show plain_table
PRELUDE=$NOSPLIT decode_as 0 nosplit 170 "${NOSPLIT_MODES:-lingc,lingc-nextn}" 32; show nosplit
PRELUDE=$NOSPLIT decode_as 0 nosplit_b 110 lingc 32 NOSPLIT_SET=b; show nosplit_b
# A bound on the MoE up-GEMM's split-K ticket tail (moe_no_ticket_probe.patch: chunk 0 stores the
# SwiGLU of its own partial, no ticket; wrong values, a timing bound only), plain decode.
git apply benchmarks/scripts/moe_no_ticket_probe.patch 2>/dev/null || patch -p1 < benchmarks/scripts/moe_no_ticket_probe.patch
decode_as 0 moe_no_ticket 110 lingc 32 MOE_PROBE=1; show moe_no_ticket
rm -f "$OUT"/moe_no_ticket.json    # the device tool brings back eight files: the log says it
ls "$OUT"
