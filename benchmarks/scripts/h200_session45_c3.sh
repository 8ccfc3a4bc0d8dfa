#!/usr/bin/env bash
# Session 45 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz from call 1 or 2): KDA's gated
# output norm fused into the end of its chain (lingc.kda_chain_normed; PdlSwap.fold_output_norm,
# off by default). Built on the CPU in session 45: one launch less a KDA layer (35 a plain or
# verify step), against a tail in the last program of each head (a ticket, staged mode too, and
# the head's o rows read back from L2). First the kernel's GPU tests and the relay gates with
# the fold on (256-token speculative == plain), then the README table's decode (lingc plain and
# relay, --profile, 32 tokens) without and with the fold in one call. Keep it (flip the default)
# only if plain or relay wall time drops beyond the ~20 us run-to-run spread.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q \
    tests/test_kda_chain_normed.py 2>&1 | stamp > "$OUT/pytest_gpu_s45_c3.log"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/scripts/with_output_norm_fold.py -m gpu -p no:logging \
    -p no:cacheprovider --tb=short -q tests/test_relay.py tests/test_batch_invariance.py 2>&1 \
    | stamp >> "$OUT/pytest_gpu_s45_c3.log"
grep -E "passed|failed" "$OUT/pytest_gpu_s45_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu_s45_c3.log" | head -20
decode_as 0 decode_nofold_s45_c3 150 lingc,lingc-nextn 32
PRELUDE="from lingc.passes.pdl_swap import PdlSwap; PdlSwap.fold_output_norm = True" \
    decode_as 0 decode_fold_s45_c3 150 lingc,lingc-nextn 32
for f in decode_nofold_s45_c3 decode_fold_s45_c3; do
    grep -E "^ *[0-9.]+ \| lingc|greedy|speculative|copy band" "$OUT/$f.log" | cut -c9- | tail -5
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
