#!/usr/bin/env bash
# Session 68 call 5 (carry .whl; the last ~340 s of device time, so plain decode only):
# KdaConfig.early_ticket's tests on CUDA, then plain decode with the table's KDA configs flipped to
# early_ticket=True against the table, --profile, 32 tokens (h200_session69_c1.sh is the full form).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_kda_kernel.py \
    -k "early_ticket or ticket_resets or persistent_matches" 2>&1 | stamp > "$OUT/pytest_kda_early.log"
tail -1 "$OUT/pytest_kda_early.log"; grep -E "FAILED|Error" "$OUT/pytest_kda_early.log" | head -5
decode_as 0 table 80 lingc 32
PRELUDE="import dataclasses, lingc.runtime.kernels.kda.kernel as K
K.CONFIGS = {k: dataclasses.replace(v, early_ticket=True) for k, v in K.CONFIGS.items()}
print('prelude: KDA early_ticket on', flush=True)" \
    decode_as 0 early_ticket 80 lingc 32
for f in table early_ticket; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|Error|prelude|_kda_chain_kernel|_gated_head|chain bound" "$OUT/$f.log" | cut -c1-170 | head -8
done
