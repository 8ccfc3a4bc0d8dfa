#!/usr/bin/env bash
# Session 22 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the GPU path of session 21's
# CPU-tested features, on a tiny checkpoint saved here: `lingc run --checkpoint
# --prompt-ids` (CUDA graphs, run-ahead) and `benchmarks.decode --checkpoint --prompt-ids-file`
# (the lingc modes resuming after the engine's prefill of the prompt, relay == plain); the sync
# probe; then every single-GPU test file on the commit (session 21 ran them on af8b8ca under the
# functionalised capture, and the MLA file on its final MLA code).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
python3 -c "
from lingc.models import build_model, preset
build_model(preset('tiny'), seed=4, progress=False).save_pretrained('/tmp/ck')" 2>&1 | tail -2
echo "5 17 2 99 41 8 63 12 7 150 3 44 9 1 250 31" > /tmp/prompt.txt
CUDA_VISIBLE_DEVICES=0 timeout 70 python3 -m lingc run --checkpoint /tmp/ck --prompt-ids 5,17,2,99,41 \
    --new-tokens 24 2>&1 | stamp > "$OUT/checkpoint_gpu.log"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.decode --checkpoint /tmp/ck --prompt-ids-file /tmp/prompt.txt \
    --modes lingc,lingc-nextn --tokens 24 --lingc-inductor 0 --out "$OUT/d" 2>&1 | stamp >> "$OUT/checkpoint_gpu.log"
grep -E "loading|prompt|identical|DIFFER|\| lingc|greedy output|checkpoint|Error|error" "$OUT/checkpoint_gpu.log" | head -30
rm -rf "$OUT/d"
# What one grid-wide synchronisation costs: a kernel boundary with and without PDL against a
# barrier inside one persistent kernel (benchmarks/sync_probe.py; decides whether a per-layer
# persistent kernel is worth building).
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m benchmarks.sync_probe --out "$OUT/s" 2>&1 | stamp > "$OUT/sync_probe.log"
SKIP=(); [ "${PIPESTATUS[0]}" = 124 ] && SKIP=(--ignore=tests/test_sync_probe.py)   # a hung barrier: not twice
cp "$OUT/s/sync_probe.json" "$OUT/" 2>/dev/null; rm -rf "$OUT/s"; grep -E "\| (pdl|plain|barrier) " "$OUT/sync_probe.log"
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT --timeout 240 --timeout-method thread \
    tests/ --ignore=tests/test_tensor_parallel.py "${SKIP[@]}" 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
