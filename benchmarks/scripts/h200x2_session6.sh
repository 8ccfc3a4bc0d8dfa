#!/usr/bin/env bash
# Session 6's measuring call on a 2-GPU H200 host (nvidia-h200-x2), two phases:
#   1  flash-tp4-rank decode, lingc plain and relay, at the same time on both GPUs: GPU 0 with
#      every pass, GPU 1 with fold_norms off (the A/B of the norm fold; each run measures its own
#      copy bandwidth and floor);
#   2  GPU tests: GPU 0 the kernels changed this session (MoE experts, rmsnorm_gemm, gemm),
#      GPU 1 the relay, KDA kernel and batch-invariance tests.
# At most 8 files come back: the logs, two JSON, the Triton cache.
set -u
source "$(dirname "$0")/device_env.sh"
PYT="python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v --durations=10"
BENCH="--preset flash-tp4-rank --context 8192 --lingc-inductor 0 --modes lingc,lingc-nextn --tokens 48"
(CUDA_VISIBLE_DEVICES=0 timeout ${P1:-220} python3 -m benchmarks.decode $BENCH --out "$OUT/a" 2>&1 \
    | stamp > "$OUT/decode.log"; cp "$OUT/a/decode.json" "$OUT/decode_lingc.json") &
(CUDA_VISIBLE_DEVICES=1 LINGC_DISABLE_PASSES=fold_norms timeout ${P1:-220} python3 -m benchmarks.decode $BENCH \
    --out "$OUT/b" 2>&1 | stamp > "$OUT/decode_nofold.log"; cp "$OUT/b/decode.json" "$OUT/decode_nofold.json") &
wait
(CUDA_VISIBLE_DEVICES=0 timeout ${P2:-220} $PYT tests/test_moe_experts.py tests/test_rmsnorm_gemm.py tests/test_gemm.py \
    2>&1 | stamp > "$OUT/pytest_gpu0.log") &
(CUDA_VISIBLE_DEVICES=1 timeout ${P2:-220} $PYT tests/test_relay.py tests/test_kda_kernel.py tests/test_batch_invariance.py \
    2>&1 | stamp > "$OUT/pytest_gpu1.log") &
wait
save_triton_cache; rm -rf "$OUT/a" "$OUT/b"; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
