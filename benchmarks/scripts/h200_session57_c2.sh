#!/usr/bin/env bash
# Session 57 call 2 (carry .whl; timeout_s ~500): Ling-3 flash-tp4-rank at context 8192 with the
# sampled graphs timed beside the greedy ones: the relay's verify_sample (speculative sampling's
# draw now lingc.sampled_targets' four passes) against verify, plain decoding's decode_sample
# against decode; lingc-inductor 0 (nothing left to Inductor in either sampled graph).
set -u
source "$(dirname "$0")/device_env.sh"
lingc_decode 0 440 --sampled-verify
grep -E "^\S*\s*\| lingc|_sample|speculative|greedy output|per graph|Error" "$OUT/decode.log" | head -14
