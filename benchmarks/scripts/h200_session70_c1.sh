#!/usr/bin/env bash
# Session 70 call 1 (carry .whl; ~6 min): session 69's call 2 (the relaxed one-lane early_ticket's
# KDA tests on CUDA, plain decode with the table against early_ticket plain + relay), then a bound
# on the split-K GEMMs' ticket tail: plain decode with gemm_no_ticket_probe.patch applied (no
# ticket, no reduction: chunk 0 stores its own partial; wrong values, a timing bound only), first
# for the fused KDA projection alone (GEMM_PROBE=fused), then for every split-K _gemm_kernel (all).
set -u
KDA_TESTS="early or ticket or persistent" KDA_TEST_LIMIT=60 RELAY_TABLE=0 \
    bash "$(dirname "$0")/h200_session69_c1_lean.sh"
source "$(dirname "$0")/device_env.sh"
git apply benchmarks/scripts/gemm_no_ticket_probe.patch 2>/dev/null || patch -p1 < benchmarks/scripts/gemm_no_ticket_probe.patch
grep -c "PROBE (a bound" runtime/kernels/gemm/kernel.py
decode_as 0 gemm_no_ticket_fused 110 lingc 32 GEMM_PROBE=fused
decode_as 0 gemm_no_ticket_all 110 lingc 32 GEMM_PROBE=all
rm -f "$OUT"/gemm_no_ticket_*.json    # the device tool brings back eight files: the logs say it
for f in plain_table gemm_no_ticket_fused gemm_no_ticket_all; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|Error|_gemm_kernel|_kda_chain_kernel|_gated_head|chain bound|by kind" "$OUT/$f.log" | cut -c1-200 | head -8
done
ls "$OUT"
