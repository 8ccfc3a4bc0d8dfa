#!/usr/bin/env bash
# Session 49 call 5 (carry .whl, .triton_cache.tar.gz; timeout_s ~150): more moe_experts configs
# for Qwen3-Next's (I, H) = (128, 2048) against the table's (16 columns x 8 chunks, first, same
# call): 8 columns x 8 chunks, 16 x 16 chunks of 128, 8 x 16, and the table's without the
# up-GEMM register cap. kernels_qwen3_moe, 40 cold layers, T = 1 and 6.
set -u
source "$(dirname "$0")/device_env.sh"
for v in "table" "8,8,96" "16,16,96" "8,16,96" "16,8,0"; do
    IFS=, read bn sk cap <<< "$v"
    CUDA_VISIBLE_DEVICES=0 timeout 40 python3 -c "
import lingc.runtime.kernels.moe_experts.kernel as K
if '$v' != 'table':
    K.CONFIGS[(128, 2048)] = K.MoeExpertsConfig(block_n=int('$bn'), split_k=int('$sk'), up_warps=4, block_h=128,
                                                down_warps=4, up_maxnreg=int('$cap'), down_warps_one_token=8)
print('config', K.config_for(128, 2048))
from benchmarks.kernels_qwen3_moe import main
raise SystemExit(main(['--out', '/tmp/q', '--layers', '40']))" 2>&1 | stamp >> "$OUT/qwen3_moe_cfg_c5.log"
done
grep -E "config|lingc" "$OUT/qwen3_moe_cfg_c5.log"
