#!/usr/bin/env bash
# h200_session69_c1.sh for a smaller device budget (carry .whl): the KDA test file on CUDA within
# 100 s, then plain decode (the table), early_ticket plain + relay (its speculative == plain check),
# the table's relay (each its own process); a call cut by its limit still brings back the finished
# parts. KDA_TESTS (a pytest -k filter), KDA_TEST_LIMIT (s) and RELAY_TABLE=0 (skip the last run)
# narrow it (h200_session69_c2.sh); unset, it is session 69 call 1's run.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
CUDA_VISIBLE_DEVICES=0 timeout "${KDA_TEST_LIMIT:-100}" python3 -m pytest -q -p no:cacheprovider --tb=short \
    tests/test_kda_kernel.py ${KDA_TESTS:+-k "$KDA_TESTS"} 2>&1 | stamp > "$OUT/pytest_kda_kernel.log"
tail -1 "$OUT/pytest_kda_kernel.log"; grep -E "FAILED|Error" "$OUT/pytest_kda_kernel.log" | head -8
EARLY="import dataclasses, lingc.runtime.kernels.kda.kernel as K
K.CONFIGS = {k: dataclasses.replace(v, early_ticket=True) for k, v in K.CONFIGS.items()}
print('prelude: KDA early_ticket on', flush=True)"
show() { echo "== $1"; grep -E "^\S*\s*\| lingc|greedy output|WRONG|Error|prelude|_kda_chain_kernel|_gated_head|chain bound" \
    "$OUT/$1.log" | cut -c1-170 | head -12; }
decode_as 0 plain_table 110 lingc 32; show plain_table
PRELUDE=$EARLY decode_as 0 early 170 lingc,lingc-nextn 32; show early    # the relay's check needs plain
[ "${RELAY_TABLE:-1}" = 0 ] || { decode_as 0 relay_table 150 lingc-nextn 32; show relay_table; }
