#!/usr/bin/env bash
# Prepared in session 68 for the next device time (carry .whl; ~8 min): KdaConfig.early_ticket on
# the GPU. test_kda_kernel.py whole on CUDA (its early-ticket tests against the model's math and
# the prefixes, twice a config, the tickets back at zero), then the decode step with the table's
# configs flipped to early_ticket=True against the table, one call, plain and relay, --profile
# (session 68 call 4's bound: plain 1.875 -> 1.850 ms with no ticket at all).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
CUDA_VISIBLE_DEVICES=0 timeout 130 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_kda_kernel.py 2>&1 \
    | stamp > "$OUT/pytest_kda_kernel.log"
tail -1 "$OUT/pytest_kda_kernel.log"; grep -E "FAILED|Error" "$OUT/pytest_kda_kernel.log" | head -8
decode_as 0 table 170 lingc,lingc-nextn 32
PRELUDE="import dataclasses, lingc.runtime.kernels.kda.kernel as K
K.CONFIGS = {k: dataclasses.replace(v, early_ticket=True) for k, v in K.CONFIGS.items()}
print('prelude: KDA early_ticket on', flush=True)" \
    decode_as 0 early_ticket 170 lingc,lingc-nextn 32
for f in table early_ticket; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|greedy output|Error|prelude|_kda_chain_kernel|_gated_head|chain bound" \
        "$OUT/$f.log" | cut -c1-170 | head -12
done
ls "$OUT"
