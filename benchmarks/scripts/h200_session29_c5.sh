#!/usr/bin/env bash
# Session 29 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): the README kernel table's KDA
# and attention rows on the pinned toolchain (session 26 measured them while Inductor's kernels,
# and some of lingc's, were built by PyTorch's CUDA 13 ptxas): kernels_kda and kernels_attn with
# their Inductor columns, one log each. The session's last ~300 s of device time: each benchmark
# writes its JSON when it ends, so a cut-off call still returns the first.
set -u
source "$(dirname "$0")/device_env.sh"
for b in "kernels_kda 100 --inductor" "kernels_attn 130"; do
    set -- $b; name=$1 limit=$2; shift 2
    CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 -m benchmarks.$name --out "$OUT/k" "$@" 2>&1 \
        | grep --line-buffered -v "UserWarning\|warnings.warn\|^$" | stamp > "$OUT/$name.log"
    echo "$name exit ${PIPESTATUS[0]}"
    cp "$OUT"/k/*.json "$OUT/" 2>/dev/null; rm -rf "$OUT/k"
    grep -E "^ *[0-9.]+ \| .*(lingc|inductor|eager|fla) \|" "$OUT/$name.log" | head -30
done
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
