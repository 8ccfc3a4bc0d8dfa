#!/usr/bin/env bash
# Session 11, call 4 (nvidia-h200-x2; carry .whl, .triton_cache.tar.gz): every mode of the
# one-GPU table on one host in one call, Inductor's CUDA-graph modes now with the cache marked
# static (cudagraph trees capture them instead of skipping for "mutated inputs").
#   GPU 0: eager, eager-nextn, Inductor default, reduce-overhead + enable_pdl;
#   GPU 1: reduce-overhead, its relay forwards, lingc plain and relay.
set -u
source "$(dirname "$0")/device_env.sh"
run_modes() {   # GPU NAME MODES
    CUDA_VISIBLE_DEVICES=$1 timeout 575 python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
        --lingc-inductor 0 --tokens 32 --modes "$3" --out "$OUT/$2" 2>&1 | grep --line-buffered -v "^W1130\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
        | stamp > "$OUT/$2.log"
    cp "$OUT/$2/decode.json" "$OUT/$2.json"; cp "$OUT/$2/decode.png" "$OUT/$2.png" 2>/dev/null; rm -rf "$OUT/$2"
}
(run_modes 0 gpu0 eager,eager-nextn,inductor,reduce-overhead-pdl) &
(run_modes 1 gpu1 reduce-overhead,reduce-overhead-nextn,lingc,lingc-nextn) &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
