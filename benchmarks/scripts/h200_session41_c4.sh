#!/usr/bin/env bash
# Session 41 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): the KDA prefill's segmented
# walks (KdaPrefillConfig.segments). Its test file whole on the GPU and the benchmark's smoke test;
# the kernels at 1024 and 8192 tokens with 1 (the table), 2, 4 and 8 segments; then the whole
# captured prefill at 1024 / 4096 / 8192 tokens with the table and with 4 segments.
# TAG (default s41_c4) names the output files; SKIP_TEST_FILE=1 leaves out the test file whole.
set -u
TAG=${TAG:-s41_c4}
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
[ "${SKIP_TEST_FILE:-0}" = 1 ] || CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -p no:logging \
    -p no:cacheprovider --tb=short -q tests/test_kda_prefill.py 2>&1 | stamp > "$OUT/pytest_changed.log"
CUDA_VISIBLE_DEVICES=0 timeout 100 $PYT tests/test_benchmark_smoke.py -k kda_prefill 2>&1 | stamp >> "$OUT/pytest_changed.log"
grep -E "passed|failed" "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda_prefill --t 1024 8192 --heads 8 \
    --segments 2 4 8 --reps 10 --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_seg_$TAG.log"
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_seg_$TAG.json"; rm -rf "$OUT/k"
grep -E "\| (1024|8192) \| (lingc|fla)" "$OUT/kda_prefill_seg_$TAG.log" | cut -c9- | cut -c1-130
for seg in 1 4; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -c "
import dataclasses
import lingc.runtime.kernels.kda_prefill.kernel as K
K.CONFIGS[(8, 128, 128)] = dataclasses.replace(K.CONFIGS[(8, 128, 128)], segments=$seg)
from benchmarks.prefill import main
raise SystemExit(main(['--preset', 'flash-tp4-rank', '--tokens', '1024', '4096', '8192', '--graphs', 'captured',
                       '--reps', '5', '--out', '$OUT/p']))" 2>&1 | stamp > "$OUT/prefill_seg${seg}_$TAG.log"
    mv "$OUT/p/prefill.json" "$OUT/prefill_seg${seg}_$TAG.json"; rm -rf "$OUT/p"
    echo "== segments $seg"; grep -E "tokens, captured, chunk|first token [0-9]" "$OUT/prefill_seg${seg}_$TAG.log" | cut -c9- | cut -c1-150
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
