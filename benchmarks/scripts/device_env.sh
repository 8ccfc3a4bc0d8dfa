# Sourced by the device scripts here: the setting every device call needs.
#   - NVLink multicast off (the device tool's rule), unbuffered Python output;
#   - OUT (the device tool's output folder, /tmp/out elsewhere);
#   - the carried wheels (.whl) and this checkout installed, logs in $OUT/install.log;
#   - Triton's cache in .triton_cache, seeded from .triton_cache.tar.gz when that is carried in
#     (a warm cache skips minutes of JIT); every process logs the entries it hits or writes
#     (triton_used/used_triton_cache.py), and `save_triton_cache` packs only those into $OUT
#     (no IRs), so the carried cache holds what the code in use compiles;
#   - `stamp`: prefixes each line read with the seconds since it started (a cut run still says
#     where the time went);
#   - `PYT`: the GPU test command (pytest -m gpu, verbose, the slowest DURATIONS tests listed);
#   - `lingc_decode GPU SECONDS [decode args]`: flash-tp4-rank decode at context 8192, lingc plain
#     and relay, 48 tokens (later arguments override), log to $OUT/decode.log, JSON to
#     $OUT/decode_lingc.json (JSON in sub-folders does not always come back);
#   - `decode_as GPU NAME SECONDS MODES TOKENS [VAR=value ...]`: the same with --profile, the
#     given modes and tokens and environment, $PRELUDE (Python, e.g. a launch-table override)
#     run first in the same process, $CONTEXT as the context (8192 unless set), log and JSON as
#     $OUT/NAME.log and $OUT/NAME.json;
#   - `gemm_sweep_as GPU SECONDS SHAPE...`: benchmarks.gemm_sweep at M 1 and 6 on the named
#     shapes (DECODE_SHAPES: the decode step's projections), log $OUT/gemm_sweep.log, JSON
#     $OUT/gemm_sweep.json (moved in whole: a caller waiting for it never reads half a file);
#   - `decode_on_sweep GPU NAME SECONDS MODES TOKENS DESIGN`: decode_as with each swept shape on
#     that sweep's best config of DESIGN (A, B, C; empty: any), prelude_sweep_table.py;
#   - the device tool brings back at most eight files from $OUT (session 14: a ninth, the test
#     log, was left out): merge or skip outputs so a call writes no more than eight;
#   - `moe_sweep_as NAME PRELUDE [VAR=value ...]`: benchmarks.moe_sweep --set table at T = 2 and 6
#     after a Python prelude (K = the moe_experts kernel module, tl = triton.language), appended to
#     $OUT/moe_sweep.log under "VARIANT NAME";
#   - `table_modes NAME MODES LIMIT`: the README table's decode command on GPU 0 for MODES, log,
#     JSON and plot as $OUT/NAME.*;
#   - `base_setup`: the baseline of an A/B, a `git archive` carried in as .base.tar.gz, installed
#     (not editable) under /tmp/base; `BASE=1 decode_as ...` then runs the baseline's lingc and
#     benchmarks, so two commits run side by side in one call;
#   - `foreign_decode_as NAME PRESET...`: benchmarks.foreign_decode at context 8192, 64 steps, for
#     each preset ($FOREIGN_LIMIT s each, 90 unless set), log and JSON as
#     $OUT/NAME_<preset without -tp4-rank>.*, the table, the token agreements and the ops left to
#     ATen / Inductor on stdout;
#   - `prefill_as NAME [base]`: benchmarks.prefill on flash-tp4-rank at 1024, 8192 and 32768
#     tokens (this checkout, or with `base` the baseline of base_setup), log and JSON as
#     $OUT/NAME.*, the per-length lines on stdout; PREFILL_TOKENS, PREFILL_ARGS (more options)
#     and PREFILL_LIMIT (seconds, 150) change it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=$PWD/.triton_cache; mkdir -p "$TRITON_CACHE_DIR"
TRITON_USED_PATH=$PWD/benchmarks/scripts/triton_used
export PYTHONPATH=$TRITON_USED_PATH${PYTHONPATH:+:$PYTHONPATH} TRITON_USED_LOG=$PWD/.triton_used.txt
[ -f .triton_cache.tar.gz ] && tar xzf .triton_cache.tar.gz -C "$TRITON_CACHE_DIR"
# Drop carried entries another ptxas built (PTX version other than what Triton's own ptxas takes):
# before `import lingc` pinned it, Inductor's PyTorch ptxas built some under the same keys
# (session 28: the KDA chain 8.84 against 7.48 us). Each dropped entry is compiled again.
python3 - "$TRITON_CACHE_DIR" <<'PY'
import glob, os, re, shutil, sys
from triton import knobs
from triton.backends.nvidia.compiler import ptx_get_version
v = ptx_get_version(knobs.nvidia.ptxas.version)
want, dropped = f"{v // 10}.{v % 10}", 0
for ptx in glob.glob(os.path.join(sys.argv[1], "*", "*.ptx")):
    m = re.search(r"^\.version (\d+\.\d+)", open(ptx).read(), re.M)
    if m and m.group(1) != want:
        shutil.rmtree(os.path.dirname(ptx), ignore_errors=True); dropped += 1
print(f"triton cache: {dropped} carried entries of another ptxas dropped (PTX {want} kept)")
PY
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation .whl/*.whl > "$OUT/install.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
# Only if the manager imports: a bad TRITON_CACHE_MANAGER would fail every Triton compile.
python3 -c "import used_triton_cache" 2>> "$OUT/install.log" \
    && export TRITON_CACHE_MANAGER=used_triton_cache:UsedEntriesCacheManager
stamp() { python3 -u -c "import sys,time;t=time.time();[print(f'{time.time()-t:7.1f} {l}',end='',flush=True) for l in sys.stdin]"; }
# Without the intermediate IRs (a cache hit needs the cubin, the json metadata, the ptx lingc's
# tests read, and the launcher .so): a whole cache grew past what the device tool returns (18.7
# MB in session 5; this keeps ~40% of it).
save_triton_cache() {
    local list=$PWD/.triton_used.sorted
    sort -u "$TRITON_USED_LOG" 2>/dev/null | while read -r k; do [ -d "$TRITON_CACHE_DIR/$k" ] && echo "$k"; done > "$list"
    [ -s "$list" ] || echo . > "$list"    # nothing logged: the whole cache
    tar czf "$OUT/triton_cache.tar.gz" -C "$TRITON_CACHE_DIR" --exclude="*.llir" --exclude="*.ttir" \
        --exclude="*.ttgir" --exclude="*.source" -T "$list"
    echo "triton cache: $(wc -l < "$list") entries packed, $(du -h "$OUT/triton_cache.tar.gz" | cut -f1)"
}
PYT="python3 -m pytest -m gpu -p no:logging -p no:cacheprovider --tb=short -v --durations=${DURATIONS:-10}"
# Every single-GPU test file's gpu-marked tests on GPU 0 into $OUT/pytest_gpu.log (LIMIT seconds,
# default 330); the summary and the failures on stdout.
gpu_tests() {
    CUDA_VISIBLE_DEVICES=0 timeout "${1:-330}" $PYT --timeout 240 --timeout-method thread \
        tests/ --ignore=tests/test_tensor_parallel.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
    tail -2 "$OUT/pytest_gpu.log"; grep -E "FAILED|Error" "$OUT/pytest_gpu.log" | head -20
}
lingc_decode() {
    local gpu=$1 limit=$2; shift 2
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
        --lingc-inductor 0 --modes lingc,lingc-nextn --tokens 48 "$@" --out "$OUT/d" 2>&1 | stamp > "$OUT/decode.log"
    cp "$OUT/d/decode.json" "$OUT/decode_lingc.json"; rm -rf "$OUT/d"
}
DECODE_SHAPES=("KDA fused q/k/v/f/g/b" "KDA o_proj / MLA dense" "MLA fused q/kv_a/g" "MLP down" "NEXTN eh_proj")
gemm_sweep_as() {
    local gpu=$1 limit=$2; shift 2
    CUDA_VISIBLE_DEVICES=$gpu timeout "$limit" python3 -m benchmarks.gemm_sweep --out "$OUT/g" --m 1 6 \
        --shapes "$@" 2>&1 | stamp > "$OUT/gemm_sweep.log"
    cp "$OUT"/g/*.json "$OUT/gemm_sweep.json.tmp"; mv "$OUT/gemm_sweep.json.tmp" "$OUT/gemm_sweep.json"
    rm -rf "$OUT/g"
}
table_modes() {   # NAME MODES LIMIT: the README table's command (32 tokens, no profiling), log/json/png as NAME.*
    CUDA_VISIBLE_DEVICES=0 timeout "$3" python3 -m benchmarks.decode --preset flash-tp4-rank --context 8192 \
        --lingc-inductor 0 --tokens 32 --modes "$2" --out "$OUT/$1" 2>&1 \
        | grep --line-buffered -v "UserWarning\|Online softmax\|split the reduction\|important use case\|softmax\.$\|warnings.warn\|^$" \
        | stamp > "$OUT/$1.log"
    cp "$OUT/$1/decode.json" "$OUT/$1.json"; cp "$OUT/$1/decode.png" "$OUT/$1.png" 2>/dev/null; rm -rf "$OUT/$1"
}
decode_on_sweep() {
    PRELUDE="exec(open('benchmarks/scripts/prelude_sweep_table.py').read())" \
        decode_as "$1" "$2" "$3" "$4" "$5" SWEEP_JSON="$OUT/gemm_sweep.json" SWEEP_DESIGN="$6"
}
moe_sweep_as() {  # NAME PYTHON-PRELUDE [VAR=value ...]: moe_sweep --set table at T = 2 and 6
    local name=$1 pre=$2; shift 2
    env "$@" CUDA_VISIBLE_DEVICES=0 timeout 100 python3 -c "
import triton.language as tl, lingc.runtime.kernels.moe_experts.kernel as K
$pre
print('VARIANT $name', flush=True)
from benchmarks.moe_sweep import main
main(['--out', '$OUT/moe', '--set', 'table', '--t', '2', '6', '--layers', '40'])
" 2>&1 | stamp >> "$OUT/moe_sweep.log"
    rm -rf "$OUT/moe"
}
prefill_as() {
    local here=$PWD
    [ "${2:-}" = base ] && cd /tmp/base/run
    env ${2:+PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH} CUDA_VISIBLE_DEVICES=0 timeout "${PREFILL_LIMIT:-150}" \
        python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens ${PREFILL_TOKENS:-1024 8192 32768} --moe grouped \
        ${PREFILL_ARGS:-} --out "$OUT/p" 2>&1 | stamp > "$OUT/$1.log"
    mv "$OUT/p/prefill.json" "$OUT/$1.json" 2>/dev/null; rm -rf "$OUT/p"; cd "$here"
    echo "== $1"; grep -E "^ *[0-9.]+ +[0-9]+ tokens, ([a-z]+, )?chunk|captured in" "$OUT/$1.log" | cut -c9-
}
base_setup() {
    mkdir -p /tmp/base/src /tmp/base/run && tar xzf .base.tar.gz -C /tmp/base/src
    python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/base/pkgs /tmp/base/src \
        >> "$OUT/install.log" 2>&1
    cp -r /tmp/base/src/benchmarks /tmp/base/run/   # run from there: no lingc sources on the path
}
decode_as() {
    local gpu=$1 name=$2 limit=$3 modes=$4 tokens=$5 here=$PWD; shift 5
    [ "${BASE:-0}" = 1 ] && { cd /tmp/base/run; set -- PYTHONPATH=/tmp/base/pkgs:$TRITON_USED_PATH "$@"; }
    env CUDA_VISIBLE_DEVICES=$gpu "$@" timeout "$limit" python3 -c "${PRELUDE:-}
from benchmarks.decode import main
raise SystemExit(main(['--preset', 'flash-tp4-rank', '--context', '${CONTEXT:-8192}', '--lingc-inductor', '0',
                       '--modes', '$modes', '--tokens', '$tokens', '--profile', '--out', '$OUT/$name']))" 2>&1 \
        | stamp > "$OUT/$name.log"
    cp "$OUT/$name/decode.json" "$OUT/$name.json"; rm -rf "$OUT/$name"; cd "$here"
}
foreign_decode_as() {
    local stem=$1 preset name; shift
    for preset in "$@"; do
        name=${stem}_${preset%%-tp4-rank}
        CUDA_VISIBLE_DEVICES=0 timeout "${FOREIGN_LIMIT:-90}" python3 -m benchmarks.foreign_decode --preset "$preset" \
            --context 8192 --tokens 64 --out "$OUT/$name" 2>&1 | stamp > "$OUT/$name.log"
        mv "$OUT/$name/foreign_decode.json" "$OUT/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
        grep -E "^\S*\s*\||agree|speculative ==|bandwidth|Error|ops lingc left" "$OUT/$name.log" | tail -9
    done
}
