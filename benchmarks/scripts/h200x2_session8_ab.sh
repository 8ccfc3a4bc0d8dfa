#!/usr/bin/env bash
# Session 8, call 1, on a 2-GPU H200 host (nvidia-h200-x2): two A/B experiments on lingc plain
# decode (flash-tp4-rank, context 8192, --profile: per-kernel critical path and the kernel
# sequence with grids in the JSON).
#   GPU 0: the table as committed, PDL trigger after the wait (late), then before it (early);
#   GPU 1: the GEMM sweep with the no-split candidates on the three shapes of a decode step's
#          projection chain, then decode with a no-split table for them (late trigger).
set -u
source "$(dirname "$0")/device_env.sh"
(decode_as 0 decode_late 260 lingc 32 LINGC_PDL_TRIGGER=late
 decode_as 0 decode_early 260 lingc 32 LINGC_PDL_TRIGGER=early) &
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m benchmarks.gemm_sweep --out "$OUT/g" --m 1 6 \
    --shapes "KDA fused q/k/v/f/g/b" "KDA o_proj / MLA dense" "MLA fused q/kv_a/g" 2>&1 | stamp > "$OUT/gemm_sweep.log"
 cp "$OUT"/g/*.json "$OUT/gemm_sweep.json"; rm -rf "$OUT/g"
 PRELUDE="import lingc.runtime.kernels.gemm.config as c
c.CONFIGS[(2560, 1024)] = c._b(16, 1)
c.CONFIGS[(5128, 2560)] = c._a(32, 1)
c.CONFIGS[(2120, 2560)] = c._a(16, 1)" decode_as 1 decode_nosplit 260 lingc 32 LINGC_PDL_TRIGGER=late) &
wait
save_triton_cache; find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
