#!/usr/bin/env bash
# Session 40 call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz): which KDA prefill
# configurations are right (call 4 found chunk 64 + 8 walk warps + one K part wrong), PDL on and off.
set -u
source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout ${LIMIT:-300} python3 benchmarks/scripts/kda_prefill_config_check.py 1024 ${CONFIGS:-} 2>&1 \
    | stamp > "$OUT/kda_prefill_configs_s40_c${CALL:-5}.log"
cut -c9- "$OUT/kda_prefill_configs_s40_c${CALL:-5}.log"
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
