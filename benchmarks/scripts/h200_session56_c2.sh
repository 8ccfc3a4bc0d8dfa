#!/usr/bin/env bash
# Session 56 call 2 (carry .whl; timeout_s ~300): benchmarks.foreign_decode with the lingc-nextn
# mode (SpecRunner's relay step with an MTP draft) at qwen3-next-tp4-rank (call 1 ran kimi-linear).
set -u
source "$(dirname "$0")/device_env.sh"
FOREIGN_LIMIT=${FOREIGN_LIMIT:-180} foreign_decode_as foreign_decode_s56_c2 qwen3-next-tp4-rank
