#!/usr/bin/env bash
# Session 15, call 5 on ONE H200 (carry .whl, .triton_cache.tar.gz, .base.tar.gz = git archive
# of this commit). Call 4's MLA GPU tests passed in both split forms (30 passed), but its
# micro-benchmark hit an illegal memory access in one of the swept cache-rows configs, which
# stopped the run. Here:
#   1. the micro-benchmark with each group of configs in its own process (a crash loses one
#      group), the verified one (64-row tiles, 2 stages, 8 warps) first;
#   2. flash-tp4-rank decode, plain and relay, with that config in the table (a prelude); the
#      table's own figures are calls 3 and 4 of this session (budget: no second run here).
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
mkdir -p /tmp/mine && tar xzf .base.tar.gz -C /tmp/mine && cd /tmp/mine
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
i=0
for cfgs in "128,64,2,8,64,32,1,1,1 128,64,2,8,64,32,0,0,1" "128,32,3,8,64,32,1,1,1" "128,32,4,8,64,32,1,1,1" "128,64,2,4,64,32,1,1,1"; do
  i=$((i+1)); args=(); for c in $cfgs; do args+=(--mla-config "$c"); done
  CUDA_VISIBLE_DEVICES=0 timeout 70 python3 -m benchmarks.kernels_attn --out "$OUT/a$i" --t 1 6 --context 8192 65536 \
      --no-inductor --no-norms "${args[@]}" 2>&1 | stamp >> "$OUT/attn.log"
  rm -rf "$OUT/a$i"
done
grep -E "\| (1|6) \| lingc|Error|skipped" "$OUT/attn.log"
PRELUDE="
import dataclasses as _dc, lingc.runtime.kernels.mla_decode.kernel as _K
_o = _K.config_for
_K.config_for = lambda L, H, R, P: _dc.replace(_o(L, H, R, P), block_l=64, num_stages=2, num_warps=8, rows_as_m=True)
print('prelude: MLA split in the cache-rows form, 64-row tiles, 2 stages, 8 warps', flush=True)" \
    decode_as 0 decode_rm 190 lingc,lingc-nextn 48
grep -E "^ *[0-9.]+ \| lingc|prelude|_mla_split|_mla_combine|greedy output" "$OUT"/decode_rm.log
save_triton_cache
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
