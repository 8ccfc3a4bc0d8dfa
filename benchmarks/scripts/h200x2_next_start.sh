#!/usr/bin/env bash
# Prepared in session 11 for the next session's first call, on a 2-GPU H200 host
# (nvidia-h200-x2); not yet run. Carry .whl (../shared/tools/device-wheels) and
# .triton_cache.tar.gz (session 11's, from call 1's save_triton_cache).
#   GPU 0: every single-GPU test file (33723fc's pdl_swap walks ran on the CPU only), then the
#          Triton cache entries this call used are packed (save_triton_cache: copy the returned
#          triton_cache.tar.gz over .triton_cache.tar.gz);
#   GPU 1: flash-tp4-rank decode, lingc plain and relay with --profile, on this checkout; then,
#          in a fresh process, compile + capture per role and per pass (benchmarks.compile_time,
#          as the decode benchmark's lingc modes: Inductor off): session 12 cut the passes' time
#          on the CPU only (819a670 pdl_swap probes, e3e431f dead-code sweep), against session
#          11's 60.5 s for the relay's roles.
set -u
DURATIONS=15 source "$(dirname "$0")/device_env.sh"
(CUDA_VISIBLE_DEVICES=0 timeout 480 $PYT --timeout 200 --timeout-method thread \
    tests --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log") &
(decode_as 1 decode_head 400 lingc,lingc-nextn 48
 CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m benchmarks.compile_time --preset flash-tp4-rank \
     --inductor 0 --out "$OUT" 2>&1 | stamp > "$OUT/compile_time.log") &
wait
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
