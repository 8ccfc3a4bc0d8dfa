#!/usr/bin/env bash
# Session 26 call 1 on ONE H200 (carry .whl; .triton_cache.tar.gz if this checkout has one):
# every single-GPU test file's gpu-marked tests (session 25's eager GPU-busy test among them),
# tests/test_kda_prefill.py whole (the one kernel test file not yet run whole on a GPU), then
# eager, lingc plain and the relay in one process: the table's sanity lines against method.md
# with eager's op count and GPU-busy time measured (session 25 counted the ops on the meta
# device only), and the session's reference times; last, the pure-read chain in the shape of
# session 25's profiled plain and relay steps (benchmarks.read_probe --step): a lower bound for
# any chain of that many kernels over those bytes.
# Expected ~500 s (session 25: gpu tests 257 s cold, a decode of the lingc modes ~95 s); run it
# with timeout_s 590.
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m pytest -p no:cacheprovider -q --tb=short tests/test_kda_prefill.py \
    2>&1 | stamp > "$OUT/pytest_kda_prefill_full.log"
tail -1 "$OUT/pytest_kda_prefill_full.log"; grep -E "^FAILED" "$OUT/pytest_kda_prefill_full.log" | head
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
    --lingc-inductor 0 --tokens 32 --modes eager,lingc,lingc-nextn --out "$OUT/table" 2>&1 \
    | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp > "$OUT/table.log"
cp "$OUT/table/decode.json" "$OUT/table.json"; rm -rf "$OUT/table"
grep -E "^ *[0-9.]+ \| |greedy output|method.md|  (eager|floor|Inductor)" "$OUT/table.log"
for mode in lingc lingc-nextn; do
    CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m benchmarks.read_probe --out "$OUT/rp_$mode" --chunk-kb 16 32 \
        --step benchmarks/results/decode_table_s25_c1.json --mode $mode 2>&1 | stamp   # stdout: the device
    cp "$OUT/rp_$mode/read_probe_step.json" "$OUT/read_probe_step_$mode.json"; rm -rf "$OUT/rp_$mode"   # returns <= 8 files
done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
