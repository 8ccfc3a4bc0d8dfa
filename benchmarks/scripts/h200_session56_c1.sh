#!/usr/bin/env bash
# Session 56 call 1 (carry .whl; timeout_s ~560): SpecRunner on the GPU: its gates on the foreign
# model with an MTP draft (Kimi-style and Qwen3-Next-style, fp32 and bf16: the four graphs
# captured, speculative == plain at every accept length and with the real draft, no host sync),
# the Ling-3 relay's and DecodeRunner's GPU tests after the Engine's split into driver.py; then
# benchmarks.foreign_decode with the new lingc-nextn mode at kimi-linear-tp4-rank.
set -u
DURATIONS=6 source "$(dirname "$0")/device_env.sh"
LOG="$OUT/pytest_s56_c1.log"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -q \
    --durations=8 tests/test_spec_runner.py tests/test_relay.py tests/test_decode_runner.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed" "$LOG"; grep -E "FAILED|Error" "$LOG" | head -12
FOREIGN_LIMIT=${FOREIGN_LIMIT:-180} foreign_decode_as foreign_decode_s56_c1 ${PRESETS:-kimi-linear-tp4-rank}
