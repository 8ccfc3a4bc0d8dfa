#!/usr/bin/env bash
# Session 39 call 3 on ONE H200 (carry .whl, .triton_cache.tar.gz): MLA's prefill reads its
# positions once per forward (one sync instead of eight); prefill at 1024/8192/32768 with the host
# report, then cProfile of the host side of a 1024-token prefill (where the host time goes).
set -u
DURATIONS=8 source "$(dirname "$0")/device_env.sh"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m benchmarks.prefill --preset flash-tp4-rank --tokens 1024 8192 32768 \
    --moe grouped --host-profile 1024 --out "$OUT/p" 2>&1 | stamp > "$OUT/prefill_s39_c3.log"
mv "$OUT/p/prefill.json" "$OUT/prefill_s39_c3.json"; mv "$OUT/p/prefill_host.pstats" "$OUT/prefill_host_s39_c3.pstats"
rm -rf "$OUT/p"
grep -E "tokens, chunk|host:" "$OUT/prefill_s39_c3.log" | cut -c9- | head -20
grep -A60 "top 45 by tottime" "$OUT/prefill_s39_c3.log" | cut -c9- | head -62
CUDA_VISIBLE_DEVICES=0 timeout 100 $PYT tests/test_mla.py 2>&1 | stamp > "$OUT/pytest_changed_s39_c3.log"
tail -2 "$OUT/pytest_changed_s39_c3.log"; grep -E "FAILED|Error" "$OUT/pytest_changed_s39_c3.log" | head
save_triton_cache
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
