#!/usr/bin/env bash
# Session 8, closing call, on a 2-GPU H200 host (nvidia-h200-x2): flash-tp4-rank decode (context
# 8192, lingc plain and relay, --profile), the two PDL trigger placements side by side:
#   GPU 0: LINGC_PDL_TRIGGER=small;   GPU 1: LINGC_PDL_TRIGGER=late.
set -u
source "$(dirname "$0")/device_env.sh"
decode_as 0 decode_small 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=small &
decode_as 1 decode_late 230 lingc,lingc-nextn 48 LINGC_PDL_TRIGGER=late &
wait
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
