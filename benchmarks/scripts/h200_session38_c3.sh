#!/usr/bin/env bash
# Session 38 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = b180dcb, call 2's
# "new"): prompt chunks with the layer norms on lingc::rmsnorm and KDA's glue on
# lingc::kda_prefill_inputs + lingc::gated_head_rmsnorm, against b180dcb, then the base again, in
# one call; a profile of the new 8192-token prefill; the GPU tests of the changed files and the
# relay's speculative == plain gates.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
run_prefill() {   # NAME DIR PYTHONPATH ARGS...
    local name=$1 dir=$2 pp=$3; shift 3
    (cd "$dir" && env ${pp:+PYTHONPATH=$pp} CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.prefill \
        --preset flash-tp4-rank --tokens 1024 8192 32768 --out "$OUT/p_$name" "$@") 2>&1 | stamp > "$OUT/prefill_${name}_s38_c3.log"
    echo "== $name"; grep -E "^ *[0-9.]+ +[0-9]+ tokens, chunk|profiled|^ *[0-9.]+   [A-Za-z ]+ +[0-9.]+ ms GPU|Error|error" "$OUT/prefill_${name}_s38_c3.log" | cut -c9- | cut -c1-330
}
run_prefill new "$PWD" "" --profile 8192
run_prefill base /tmp/base/run /tmp/base/pkgs:$TRITON_USED_PATH
run_prefill new2 "$PWD" ""
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]; merged = {}
for d in sorted(glob.glob(f"{out}/p_*")):
    f = os.path.join(d, "prefill.json")
    if os.path.exists(f): merged[os.path.basename(d)[2:]] = json.load(open(f))
json.dump(merged, open(f"{out}/prefill_s38_c3.json", "w"), indent=1)
PY
rm -rf "$OUT"/p_*
cat "$OUT"/prefill_new_s38_c3.log "$OUT"/prefill_base_s38_c3.log "$OUT"/prefill_new2_s38_c3.log > "$OUT/prefill_s38_c3.log"
rm -f "$OUT"/prefill_*_s38_c3.log
CUDA_VISIBLE_DEVICES=0 timeout 330 $PYT tests/test_kda_prefill_inputs.py tests/test_model.py tests/test_kda.py \
    tests/test_kda_prefill.py tests/test_norm_kernels.py tests/test_relay.py tests/test_reference_decoding.py \
    tests/test_decode_checkpoint.py 2>&1 | stamp > "$OUT/pytest_changed_s38_c3.log"
tail -2 "$OUT/pytest_changed_s38_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c3.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
