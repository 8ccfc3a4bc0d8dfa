#!/usr/bin/env bash
# Session 56 call 4 (carry .whl; timeout_s ~480): Ling-3 flash-tp4-rank at context 8192 after the
# Engine's split into driver.py (a control: the README table's lingc rows), with the relay's
# verify_sample graph (a sampling request's verify) compiled, captured and timed beside verify.
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 420 --sampled-verify
grep -E "^\S*\s*\| lingc|verify_sample|speculative|greedy output|per graph|Error" "$OUT/decode.log" | head -12
