#!/usr/bin/env bash
# Ran on 465b5d0 plus experiment knobs in moe_experts/kernel.py (PAIR_LANES_MIN and PAIR_TILE_FIRST), removed with the
# pair layout after call 4 (results/README.md, session 17): a record, it does not run on later commits.
# Session 17 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz): the pair layout on 128 lanes
# (call 3: as fast as align at T = 6 less the align launch, within 5 us) with the weight tile
# requested after the rows (PAIR_TILE_FIRST = False: one dependent round trip fewer before x).
set -u
source "$(dirname "$0")/device_env.sh"
moe_sweep_as npr128_tile_after "K.PAIR_LANES_MIN = 128; K.PAIR_TILE_FIRST = tl.constexpr(False)"
moe_sweep_as npr128 "K.PAIR_LANES_MIN = 128"
grep -E "VARIANT|\| (2|6) \|" "$OUT/moe_sweep.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
