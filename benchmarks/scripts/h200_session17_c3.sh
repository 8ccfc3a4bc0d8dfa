#!/usr/bin/env bash
# Ran on 465b5d0 plus experiment knobs in moe_experts/kernel.py (PAIR_LANES_MIN), removed with the
# pair layout after call 4 (results/README.md, session 17): a record, it does not run on later commits.
# Session 17 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): the pair layout at T = 2 and 6
# (slow in calls 1-2) against T = 16 (on par with align): 128 pair lanes at every T (NPR), and
# without PDL (LINGC_DISABLE_PDL=1, both layouts).
set -u
source "$(dirname "$0")/device_env.sh"
moe_sweep_as npr128 "K.PAIR_LANES_MIN = 128"
moe_sweep_as nopdl "" LINGC_DISABLE_PDL=1
moe_sweep_as npr128_nopdl "K.PAIR_LANES_MIN = 128" LINGC_DISABLE_PDL=1
grep -E "VARIANT|\| (2|6) \|" "$OUT/moe_sweep.log"
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
