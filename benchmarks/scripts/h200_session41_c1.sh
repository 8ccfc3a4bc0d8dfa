#!/usr/bin/env bash
# Session 41 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz): the changed files' GPU tests
# (prefill graphs, the prefill and read-probe benchmarks; the 2-GPU ones skip), then what a pure
# read of the issues' target sizes reaches, with more warps and beside torch's own read, each next
# to the lingc kernel that reads the same bytes: the evidence on the copy-bandwidth targets of the
# backend issue (SwiGLU dense MLP, 75%) and the skinny-GEMM issue (fused projections, 80%).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT --timeout 150 --timeout-method thread tests/test_prefill_graphs.py \
    tests/test_tensor_parallel.py tests/test_benchmark_smoke.py -k "prefill or read_probe or tp2" 2>&1 \
    | stamp > "$OUT/pytest_changed.log"
tail -2 "$OUT/pytest_changed.log"; grep -E "FAILED|Error" "$OUT/pytest_changed.log" | head -20
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.read_probe --mb 5.24 10.85 15.73 26.25 \
    --chunk-kb 8 16 32 64 --warps 4 8 --library --replays 30 --out "$OUT/r" 2>&1 | stamp > "$OUT/read_probe_s41_c1.log"
mv "$OUT/r/read_probe.json" "$OUT/read_probe_s41_c1.json"; rm -rf "$OUT/r"
grep -E "^ *[0-9.]+ \|" "$OUT/read_probe_s41_c1.log" | cut -c9- | head -60
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
