#!/usr/bin/env bash
# Session 69 call 2 (carry .whl; ~3 min): KdaConfig.early_ticket in its relaxed one-lane atom.inc form
# (the KDA tests of the ticket on CUDA), then plain decode (the table) and early_ticket plain + relay
# (its speculative == plain check); the relay does not run this mode (verify stages).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_kda_kernel.py -k "early or ticket or persistent" 2>&1 \
    | stamp > "$OUT/pytest_kda_kernel.log"
tail -1 "$OUT/pytest_kda_kernel.log"; grep -E "FAILED|Error" "$OUT/pytest_kda_kernel.log" | head -8
EARLY="import dataclasses, lingc.runtime.kernels.kda.kernel as K
K.CONFIGS = {k: dataclasses.replace(v, early_ticket=True) for k, v in K.CONFIGS.items()}
print('prelude: KDA early_ticket on', flush=True)"
show() { echo "== $1"; grep -E "^\S*\s*\| lingc|greedy output|WRONG|Error|prelude|_kda_chain_kernel|_gated_head|chain bound" \
    "$OUT/$1.log" | cut -c1-170 | head -12; }
decode_as 0 plain_table 110 lingc 32; show plain_table
PRELUDE=$EARLY decode_as 0 early 170 lingc,lingc-nextn 32; show early    # the relay's check needs plain
