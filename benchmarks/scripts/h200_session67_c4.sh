#!/usr/bin/env bash
# Session 67 call 4 (carry .whl; the last ~470 s of device time): the MLA split at 4 warps and 2
# stages (two programs an SM) in the decode step on an H100. Alone on the H200 it took 14.8 / 21.4
# us at T = 1 / 6 against the table's 14.0 / 26.4, and lost in the step there (session 21: plain
# 1.738 -> 1.763, relay 4.207 -> 4.228 ms). The table (8 warps, 3 stages) against a prelude that
# overrides config_for's warps and stages, in one call, plain and relay with --profile.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
decode_as 0 mla_w8 170 lingc,lingc-nextn 32
PRELUDE="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as K
_cf = K.config_for
K.config_for = lambda L, H, R, P: dataclasses.replace(_cf(L, H, R, P), num_warps=4, num_stages=2)
print('prelude: MLA split at 4 warps, 2 stages', flush=True)" \
    decode_as 0 mla_w4 150 lingc,lingc-nextn 32
for f in mla_w8 mla_w4; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|prelude|_mla_split|_mla_combine|chain bound" "$OUT/$f.log" | cut -c1-170 | head -16
done
ls "$OUT"
