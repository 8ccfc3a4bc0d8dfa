#!/usr/bin/env bash
# Session 38 call 2 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = d7c4756): the
# MoE's grouped form selecting with lingc::moe_select, prefill chunk 8192 and GROUPED_CHUNK 8192,
# against d7c4756 at chunks 4096 (its default) and 8192, and this commit with GROUPED_CHUNK 4096;
# a profile of the new 8192-token prefill; the GPU tests of the changed files.
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
base_setup
run_prefill() {   # NAME DIR PYTHONPATH PRELUDE ARGS...
    local name=$1 dir=$2 pp=$3 pre=$4; shift 4
    (cd "$dir" && env ${pp:+PYTHONPATH=$pp} CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -c "$pre
from benchmarks.prefill import main
import sys; raise SystemExit(main(sys.argv[1:]))" --preset flash-tp4-rank --tokens 1024 8192 32768 --out "$OUT/p_$name" "$@") 2>&1 \
        | stamp > "$OUT/prefill_${name}_s38_c2.log"
    echo "== $name"; grep -E "^ *[0-9.]+ +[0-9]+ tokens, chunk|profiled|^ *[0-9.]+   [A-Za-z ]+ +[0-9.]+ ms GPU|Error|error" "$OUT/prefill_${name}_s38_c2.log" | cut -c9- | cut -c1-330
}
run_prefill base /tmp/base/run /tmp/base/pkgs:$TRITON_USED_PATH "" --chunk 4096 8192
run_prefill new "$PWD" "" "" --profile 8192
run_prefill new_moe4096 "$PWD" "" "import lingc.models.moe as m; m.GROUPED_CHUNK = 4096"
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]; merged = {}
for d in sorted(glob.glob(f"{out}/p_*")):
    f = os.path.join(d, "prefill.json")
    if os.path.exists(f): merged[os.path.basename(d)[2:]] = json.load(open(f))
json.dump(merged, open(f"{out}/prefill_s38_c2.json", "w"), indent=1)
PY
rm -rf "$OUT"/p_*
cat "$OUT"/prefill_*_s38_c2.log > "$OUT/prefill_s38_c2.log"; rm -f "$OUT"/prefill_*_s38_c2.log
CUDA_VISIBLE_DEVICES=0 timeout 200 $PYT tests/test_moe_kernels.py tests/test_moe.py tests/test_moe_combine.py \
    tests/test_reference_decoding.py 2>&1 | stamp > "$OUT/pytest_changed_s38_c2.log"
tail -2 "$OUT/pytest_changed_s38_c2.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s38_c2.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
