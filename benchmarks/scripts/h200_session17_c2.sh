#!/usr/bin/env bash
# Ran on 465b5d0 plus experiment knobs in moe_experts/kernel.py (PAIR_TILE_FIRST), removed with the
# pair layout after call 4 (results/README.md, session 17): a record, it does not run on later commits.
# Session 17 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz): why the pair layout's up-GEMM
# took 99 us a layer at T = 6 in call 1 (align: 29 us). The MoE layer alone at T = 2, 6 and 16,
# register caps (--set regs: the table's r96, [align], r0, down r80) with the pair layout's weight
# tile requested before its rows (as committed) and after them (PAIR_TILE_FIRST = False).
set -u
source "$(dirname "$0")/device_env.sh"
for first in True False; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -c "
import triton.language as tl, lingc.runtime.kernels.moe_experts.kernel as K
K.PAIR_TILE_FIRST = tl.constexpr($first)
print('PAIR_TILE_FIRST', K.PAIR_TILE_FIRST)
from benchmarks.moe_sweep import main
main(['--out', '$OUT/moe', '--set', 'regs', '--t', '2', '6', '16', '--layers', '40'])
" 2>&1 | stamp >> "$OUT/moe_sweep.log"
    rm -rf "$OUT/moe"
done
grep -E "PAIR_TILE|\| (2|6|16) \|" "$OUT/moe_sweep.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
