#!/usr/bin/env bash
# Session 21 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's split kernel with a
# 32-row query tile (MlaDecodeConfig.block_h = 32: 4 queries of 8 heads per program, so a T = 6
# verify chain runs 2 programs per split instead of 3; 248 registers at 8 warps, no spills in the
# sm_90 compile). The split programs are one per SM (registers), so a T = 6 chain at 8192 runs
# 192 programs in two waves and at 65536 384 programs in three: session 21 call 1 saw T = 6 cost
# 2.6x T = 1 at 65536.
#   1. MLA GPU tests (reference, batch invariance at both tiles) and the bitwise probe 16 vs 32;
#   2. kernels_attn at 8192 and 65536, T = 1, 6, 8: the table against block_h 32 (3 and 2 stages);
#   3. decode plain + relay at 8192: the table against block_h 32 (a config_for prelude).
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 150 $PYT tests/test_mla_decode.py 2>&1 | stamp > "$OUT/pytest_gpu.log"
CUDA_VISIBLE_DEVICES=0 timeout 60 python3 benchmarks/scripts/mla_tile_bits.py 2>&1 | stamp >> "$OUT/pytest_gpu.log"
tail -12 "$OUT/pytest_gpu.log"
for L in 8192 65536; do
    S=$(( L == 8192 ? 128 : 512 ))
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m benchmarks.kernels_attn --out "$OUT/a" --no-norms --no-inductor \
        --context $L --t 1 6 8 --mla-config $S,64,3,8,64,32,32 --mla-config $S,64,2,8,64,32,32 2>&1 \
        | stamp >> "$OUT/kernels_attn.log"
    cp "$OUT/a"/*.json "$OUT/ka_$L.json" 2>/dev/null; rm -rf "$OUT/a"
done
# One JSON for both contexts: the device tool returns at most eight files.
python3 -c "import json,sys; json.dump({L: json.load(open(f'$OUT/ka_{L}.json')) for L in (8192, 65536)},
    open('$OUT/kernels_attn.json', 'w'), indent=1)" && rm -f "$OUT"/ka_*.json
grep -E "\| lingc(-s| )" "$OUT/kernels_attn.log"
TILE32="import dataclasses, lingc.runtime.kernels.mla_decode.kernel as M
_table = M.config_for
M.config_for = lambda *a: dataclasses.replace(_table(*a), block_h=32)"
decode_as 0 decode_table 160 lingc,lingc-nextn 48
PRELUDE="$TILE32" decode_as 0 decode_tile32 160 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|greedy output|by kind|_mla_split|_mla_combine" "$OUT"/decode_*.log
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
