#!/usr/bin/env bash
# Session 37 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive 0e2ea1e):
# time to first token before (0e2ea1e, the single-pass KDA prefill kernel) and after (the three
# kernels at 3xTF32) in one call, new / base / new so that drift shows. Expected ~250 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
prefill_run() {   # NAME [BASE]
    local here=$PWD
    [ "${2:-}" = base ] && cd /tmp/base/run
    env ${2:+PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH} CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.prefill \
        --preset flash-tp4-rank --tokens 1024 8192 32768 --moe grouped --out "$OUT/p" 2>&1 | stamp > "$OUT/$1.log"
    mv "$OUT/p/prefill.json" "$OUT/$1.json" 2>/dev/null; rm -rf "$OUT/p"; cd "$here"
    echo "== $1"; grep -E "^ *[0-9.]+ +[0-9]+ tokens" "$OUT/$1.log" | cut -c9-
}
prefill_run prefill_new_s37_c3
prefill_run prefill_base_s37_c3 base
prefill_run prefill_new2_s37_c3
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
