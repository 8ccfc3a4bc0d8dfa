#!/usr/bin/env bash
# Session 68 call 4 (carry .whl; the last ~340 s of device time): a bound on the KDA chain's
# persistent-mode ticket (each program's acq_rel atomic before the last one writes the q/k conv
# window): plain decode as it is, then with kda_no_ticket_probe.patch applied (no ticket, v-block
# 0 writes the window: racy, wrong values possible, a timing bound only), --profile, 32 tokens.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
decode_as 0 table 110 lingc 32
git apply benchmarks/scripts/kda_no_ticket_probe.patch 2>/dev/null || patch -p1 < benchmarks/scripts/kda_no_ticket_probe.patch
grep -c "PROBE (a bound" runtime/kernels/kda/kernel.py
decode_as 0 kda_no_ticket 110 lingc 32
for f in table kda_no_ticket; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|Error|_kda_chain_kernel|_gated_head|chain bound" "$OUT/$f.log" | cut -c1-170 | head -8
done
ls "$OUT"
