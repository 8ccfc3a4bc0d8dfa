#!/usr/bin/env bash
# Session 67 call 3 (carry .whl; after call 2 on the warm machine): the decode step, plain and
# relay with --profile, 32 tokens, with the spread cos / sin (this tree) against
# prelude_rope_replicated (the split kernels' form before session 67) in the same call; then the
# relay's 256-token speculative == plain gates.
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
decode_as 0 rope_spread 200 lingc,lingc-nextn 32
PRELUDE="import importlib.util as u; s = u.spec_from_file_location('p', 'benchmarks/scripts/prelude_rope_replicated.py'); s.loader.exec_module(u.module_from_spec(s))" \
    decode_as 0 rope_replicated 170 lingc,lingc-nextn 32
for f in rope_spread rope_replicated; do
    echo "== $f"; grep -E "^\S*\s*\| lingc|speculative|Error|prelude|_mla_split|by kind|chain bound" "$OUT/$f.log" | head -24
done
DURATIONS=4 timeout 150 $PYT tests/test_relay.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -8
ls "$OUT"
