#!/usr/bin/env bash
# Session 49 call 4 (carry .whl, .triton_cache.tar.gz; timeout_s ~200): Qwen3-Next's MoE block
# (kernels_qwen3_moe, 40 cold layers, T = 1 and 6) with moe_experts launch configs for
# (I, H) = (128, 2048) against the rule's (first, same call): Ling-3's table pattern (32 columns, 256-wide H
# chunks, 128-column down tile, capped up registers, 8 down warps for one token) and a
# 16-column variant of it.
set -u
source "$(dirname "$0")/device_env.sh"
for v in "rule,0,0" "32,8,128" "16,8,128" "32,4,64"; do
    IFS=, read bn sk bh <<< "$v"
    CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -c "
import lingc.runtime.kernels.moe_experts.kernel as K
if '$bn' != 'rule':
    K.CONFIGS[(128, 2048)] = K.MoeExpertsConfig(block_n=int('$bn'), split_k=$sk, up_warps=4, block_h=$bh,
                                                down_warps=4, up_maxnreg=96, down_warps_one_token=8)
print('config', K.config_for(128, 2048))
from benchmarks.kernels_qwen3_moe import main
raise SystemExit(main(['--out', '$OUT/q_$bn', '--layers', '40']))" 2>&1 | stamp > "$OUT/qwen3_moe_cfg_${bn}_${sk}_${bh}.log"
    grep -E "config|lingc" "$OUT/qwen3_moe_cfg_${bn}_${sk}_${bh}.log"
done
