#!/usr/bin/env bash
# Session 28 call 6 on ONE H200 (carry .whl, .triton_cache.tar.gz). Call 4: on one machine the KDA
# chain from the carried Triton cache took 8.84 us (T = 6 staged), compiled fresh 7.48 us, and the
# six chain entries of the same cache keys hold different cubins (the carried ones ~500 bytes
# larger). Why? The device's ptxas version; the fresh compile's PTX against the carried PTX of
# the same key (header and code, debug lines aside); the carried PTX assembled again here.
# Expected ~90 s; run with timeout_s 240.
set -u
source "$(dirname "$0")/device_env.sh"
B=$(python3 -c "import triton,os;print(os.path.join(os.path.dirname(triton.__file__),'backends','nvidia','bin'))")
$B/ptxas --version | tail -2
python3 -c "from triton import knobs; t = knobs.nvidia.ptxas; print('triton ptxas', t.path, t.version)"
mkdir -p /tmp/fresh_cache
TRITON_CACHE_DIR=/tmp/fresh_cache TRITON_USED_LOG=$OUT/used.txt CUDA_VISIBLE_DEVICES=0 timeout 150 \
    python3 -m benchmarks.kernels_kda --t 6 --out /tmp/k > /dev/null 2>&1
for k in $(sort -u $OUT/used.txt); do
    f=/tmp/fresh_cache/$k/_kda_chain_kernel; c=$TRITON_CACHE_DIR/$k/_kda_chain_kernel
    [ -f $f.cubin ] && [ -f $c.cubin ] || continue
    echo "== $k"
    grep -m1 "^.version" $f.ptx; grep -m1 "^.version" $c.ptx
    strip() { grep -vE "^\s*(\.loc|\.file|//|\.b8|\.b32|\.b64)|^\$L__|debug" "$1"; }
    echo "ptx code lines differing: $(diff <(strip $f.ptx) <(strip $c.ptx) | grep -c '^[<>]')"
    $B/ptxas -lineinfo --gpu-name=sm_90a $c.ptx -o /tmp/re.cubin && cmp -s /tmp/re.cubin $c.cubin \
        && echo "carried ptx reassembled here: same cubin" || echo "carried ptx reassembled here: OTHER cubin ($(stat -c %s /tmp/re.cubin) bytes)"
    sass() { $B/cuobjdump -sass "$1" | grep -E "^\s+/\*[0-9a-f]{4}\*/" | sed 's|/\*[0-9a-f]*\*/||; s|;.*||'; }
    echo "sass lines fresh $(sass $f.cubin | wc -l), carried $(sass $c.cubin | wc -l), differing $(diff <(sass $f.cubin) <(sass $c.cubin) | grep -c '^[<>]')"
    diff <(strip $f.ptx) <(strip $c.ptx) | head -12
done 2>&1 | tee "$OUT/cubin_diff.log" | head -80
