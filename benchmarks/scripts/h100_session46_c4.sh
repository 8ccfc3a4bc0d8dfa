#!/usr/bin/env bash
# Session 46 call 4 (an H100 was lent; carry .whl, .triton_cache.tar.gz): session 41 call 4 without
# its first step (test_kda_prefill.py whole passed in call 3). The KDA prefill's segmented
# walks (KdaPrefillConfig.segments). Its test file whole on the GPU and the benchmark's smoke test;
# the kernels at 1024 and 8192 tokens with 1 (the table), 2, 4 and 8 segments; then the whole
# captured prefill at 1024 / 4096 / 8192 tokens with the table and with 4 segments.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 100 $PYT tests/test_benchmark_smoke.py -k kda_prefill 2>&1 | stamp > "$OUT/pytest_changed.log"
grep -E "passed|failed" "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_kda_prefill --t 1024 8192 --heads 8 \
    --segments 2 4 8 --reps 10 --out "$OUT/k" 2>&1 | stamp > "$OUT/kda_prefill_seg_s46_c4.log"
mv "$OUT/k/kernels_kda_prefill.json" "$OUT/kda_prefill_seg_s46_c4.json"; rm -rf "$OUT/k"
grep -E "\| (1024|8192) \| (lingc|fla)" "$OUT/kda_prefill_seg_s46_c4.log" | cut -c9- | cut -c1-130
for seg in 1 4; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -c "
import dataclasses
import lingc.runtime.kernels.kda_prefill.kernel as K
K.CONFIGS[(8, 128, 128)] = dataclasses.replace(K.CONFIGS[(8, 128, 128)], segments=$seg)
from benchmarks.prefill import main
raise SystemExit(main(['--preset', 'flash-tp4-rank', '--tokens', '1024', '4096', '8192', '--graphs', 'captured',
                       '--reps', '5', '--out', '$OUT/p']))" 2>&1 | stamp > "$OUT/prefill_seg${seg}_s46_c4.log"
    mv "$OUT/p/prefill.json" "$OUT/prefill_seg${seg}_s46_c4.json"; rm -rf "$OUT/p"
    echo "== segments $seg"; grep -E "tokens, captured, chunk|first token [0-9]" "$OUT/prefill_seg${seg}_s46_c4.log" | cut -c9- | cut -c1-150
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
