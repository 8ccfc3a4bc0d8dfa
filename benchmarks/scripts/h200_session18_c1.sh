#!/usr/bin/env bash
# Session 18 call 1 on ONE H200 (carry .whl, .triton_cache.tar.gz, and .base.tar.gz = `git archive
# --format=tar.gz -o .base.tar.gz 7cfdf8b`, session 17's last commit):
#   1. GPU tests of the router, MLA decode, the relay's exactness and batch invariance here;
#   2. decode, plain + relay (--profile): 7cfdf8b (BASE=1) against this checkout, in one call
#      (here: the router's selection over the kept groups only, MLA's score product as three
#      independent MMA chains);
#   3. the MLA micro-benchmark (kernels_attn, T = 1 / 6, contexts 8192 / 65536) on both.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 260 $PYT --timeout 200 --timeout-method thread tests/test_moe_kernels.py \
    tests/test_mla_decode.py tests/test_relay.py tests/test_batch_invariance.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
tail -3 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
base_setup
BASE=1 decode_as 0 decode_base 150 lingc,lingc-nextn 48
decode_as 0 decode_head 150 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|layer chains|_mla_split|_router_select" "$OUT"/decode_*.log
attn() {  # NAME [base]
    local here=$PWD
    [ "${2:-}" = base ] && { cd /tmp/base/run; export PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH; }
    echo "=== $1" >> "$OUT/attn.log"
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m benchmarks.kernels_attn --out /tmp/attn_$1 --t 1 6 \
        --context 8192 65536 --no-inductor --no-norms 2>&1 | stamp >> "$OUT/attn.log"
    cd "$here"; export PYTHONPATH=$TRITON_USED_PATH
}
attn head; attn base base; attn head2
grep -E "MLA|mla" "$OUT/attn.log" | head -40
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
