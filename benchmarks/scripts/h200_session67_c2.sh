#!/usr/bin/env bash
# Session 67 call 2 (carry .whl; ~950 s of device time were left after refused and failed starts,
# so one call did what was planned as three; one H100): the MLA split's queries' cos / sin spread
# over the program's threads (rope.cos_sin_spread: one angle a thread instead of 16, sm_90 SASS).
# It ran at 7a84ee8, where rope.cos_sin_spread and benchmarks/scripts/prelude_rope_replicated.py
# exist; level, not kept: benchmarks/results/rope_cos_sin_spread_s67_c2.patch holds the kernels'
# change (the prelude is at 7a84ee8).
# 1. mla_decode's GPU tests (the same bits as the reference's RoPE, batch invariance, positions
#    from a base); 2. kernels_attn's MLA at 8192, T = 1 and 6: the spread form (`lingc`) against
#    q rotated beforehand (`lingc-q-roped`, no in-kernel RoPE), then with prelude_rope_replicated
#    (the form before this session) in the same call; 3. the decode step, plain and relay with
#    --profile, 32 tokens (its speculative == plain check; the split's critical time per step).
set -u
source "$(dirname "$0")/device_env.sh"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
DURATIONS=4 timeout 110 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -2
grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -8
ka() {  # NAME PRELUDE
    timeout 80 python3 -c "$2
from benchmarks.kernels_attn import main
raise SystemExit(main(['--no-norms', '--no-inductor', '--no-gqa', '--no-gqa-layer', '--context', '8192',
                       '--t', '1', '6', '--replays', '50', '--out', '$OUT/ka']))" 2>&1 | stamp > "$OUT/$1.log"
    mv "$OUT/ka/kernels_attn.json" "$OUT/$1.json"; rm -rf "$OUT/ka"
    echo "== $1"; grep -E "mla_decode|copy bandwidth|prelude|Error|FAILED" "$OUT/$1.log" | cut -c1-160 | head -16
}
ka kernels_attn_spread ""
ka kernels_attn_replicated "import importlib.util as u; s = u.spec_from_file_location('p', 'benchmarks/scripts/prelude_rope_replicated.py'); s.loader.exec_module(u.module_from_spec(s))"
decode_as 0 decode_rope_spread 190 lingc,lingc-nextn 32
echo "== decode"; grep -E "^\S*\s*\| lingc|speculative|Error|_mla_split|chain bound" "$OUT/decode_rope_spread.log" | head -16
ls "$OUT"
