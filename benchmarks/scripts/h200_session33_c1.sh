#!/usr/bin/env bash
# Session 33 call 1 on ONE H200 (carry .whl; this checkout has no Triton cache, so a cold JIT):
# every single-GPU test file's gpu-marked tests on the session's code (the last whole run was
# session 29's call 1; among them the one-pass one-token down-GEMM's bits against the table's at
# flash-tp4-rank's shapes), then plain decode, profiled, with the table's MoE config and with the
# one-token down-GEMM + combine in one pass (down_one_token_block_h 32, then 16).
# Expected ~300 + 3 x ~75 s; run with timeout_s 600.
# Ran on 80387d8; the one-pass kernel was removed after the call (benchmarks/results/
# moe_down_one_pass_s33_c1.patch applies it again).
set -u
DURATIONS=10 source "$(dirname "$0")/device_env.sh"
gpu_tests 330
ONE="import dataclasses, lingc.runtime.kernels.moe_experts.kernel as M
M.CONFIGS[(192, 2560)] = dataclasses.replace(M.CONFIGS[(192, 2560)], down_one_token_block_h="
decode_as 0 decode_base_s33_c1 90 lingc 32
PRELUDE="${ONE}32)" decode_as 0 decode_one32_s33_c1 90 lingc 32
PRELUDE="${ONE}16)" decode_as 0 decode_one16_s33_c1 90 lingc 32
for f in base one32 one16; do grep -E "^ *[0-9.]+ \| |lingc.*ms" "$OUT/decode_${f}_s33_c1.log" | tail -2; done
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
