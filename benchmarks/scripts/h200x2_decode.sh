#!/usr/bin/env bash
# One device call on a 2-GPU H200 host (the device tool's nvidia-h200-x2), both GPUs in parallel:
#   GPU 0  the MoE expert-kernel sweep and per-launch breakdown, then flash-tp4-rank decode with
#          lingc plain and the lingc relay
#   GPU 1  the KDA kernel GPU tests and the relay's three-graph test (a stack dump if it runs past
#          TEST_S), then decode in the modes not measured yet on flash-tp4-rank (eager NEXTN,
#          Inductor default, reduce-overhead with Inductor's PDL)
# Triton's cache lives in .triton_cache, seeded from .triton_cache.tar.gz when that is carried in
# (a warm cache skips minutes of JIT), and goes back out as $OUT/triton_cache.tar.gz. Logs and
# JSON under $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton_cache; mkdir -p "$TRITON_CACHE_DIR"
[ -f .triton_cache.tar.gz ] && tar xzf .triton_cache.tar.gz -C "$TRITON_CACHE_DIR"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation .whl/*.whl > "$OUT/install.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
stamp() { python3 -u -c "import sys,time;t=time.time();[print(f'{time.time()-t:7.1f} {l}',end='',flush=True) for l in sys.stdin]"; }
LIMIT=${LIMIT:-540}; TEST_S=${TEST_S:-150}
BENCH="--preset flash-tp4-rank --context 8192 --lingc-inductor 0 --tokens 96"
START=$(date +%s); left() { echo $((LIMIT - ($(date +%s) - START))); }
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.moe_sweep --out "$OUT" 2>&1 | stamp > "$OUT/moe_sweep.log"
 CUDA_VISIBLE_DEVICES=0 timeout $(left) python3 -m benchmarks.decode $BENCH --modes ${MODES0:-lingc,lingc-nextn} \
    --out "$OUT/gpu0" 2>&1 | stamp > "$OUT/decode_gpu0.log") &
(CUDA_VISIBLE_DEVICES=1 timeout 100 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v \
    tests/test_kda_kernel.py 2>&1 | stamp > "$OUT/pytest_kda.log"
 CUDA_VISIBLE_DEVICES=1 python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v \
    --timeout $TEST_S --timeout-method thread \
    "tests/test_relay.py::test_gpu_three_graphs_no_sync_run_ahead_no_recapture" 2>&1 | stamp > "$OUT/pytest_relay.log"
 CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m benchmarks.decode $BENCH \
    --modes ${MODES1:-eager-nextn,reduce-overhead-pdl,inductor} --out "$OUT/gpu1" 2>&1 | stamp > "$OUT/decode_gpu1.log") &
wait
tar czf "$OUT/triton_cache.tar.gz" -C "$TRITON_CACHE_DIR" . 2>/dev/null; ls -la "$OUT"
