#!/usr/bin/env bash
# Session 37 call 7 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive
# 3fda355): the prefill MoE's slot sum on one lingc::moe_combine_sorted kernel. Its GPU tests and
# the MoE's, then time to first token before (3fda355: index_copy, fp32 copy and the ATen slot sum)
# and after in one call, new / base / new. Expected ~200 s.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
LOG=$OUT/pytest_changed_s37_c7.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_moe_combine.py tests/test_moe.py 2>&1 | stamp > "$LOG"
grep -E "passed|failed|FAILED|Error" "$LOG" | head -20
base_setup
prefill_run() {   # NAME [base]
    local here=$PWD
    [ "${2:-}" = base ] && cd /tmp/base/run
    env ${2:+PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH} CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.prefill \
        --preset flash-tp4-rank --tokens 1024 8192 32768 --moe grouped --out "$OUT/p" 2>&1 | stamp > "$OUT/$1.log"
    mv "$OUT/p/prefill.json" "$OUT/$1.json" 2>/dev/null; rm -rf "$OUT/p"; cd "$here"
    echo "== $1"; grep -E "^ *[0-9.]+ +[0-9]+ tokens, chunk" "$OUT/$1.log" | cut -c9-
}
prefill_run prefill_new_s37_c7
prefill_run prefill_base_s37_c7 base
prefill_run prefill_new2_s37_c7
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
