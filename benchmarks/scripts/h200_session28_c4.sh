#!/usr/bin/env bash
# Session 28 call 4 on ONE H200 (carry .whl, .triton_cache.tar.gz). The KDA chain's T = 6 verify
# took 7.46 us in call 2, where its source had changed (a fresh compile on the device), and
# 8.81 / 8.84 us in calls 1 and 3, whose binary came from the carried Triton cache (session 27's);
# session 23, a fresh compile, 7.49; session 26, 8.83. Is the carried binary the slow one? On one
# machine: kernels_kda at T = 1 and 6 with the carried cache, then with an empty cache (a fresh
# compile), then the carried one again; then the chain's cubins of both caches (key, md5, size,
# registers) side by side.
# Expected ~150 s; run with timeout_s 400.
set -u
DURATIONS=5 source "$(dirname "$0")/device_env.sh"
run_kda() {  # NAME CACHE_DIR
    TRITON_CACHE_DIR=$2 TRITON_USED_LOG=$OUT/used_$1.txt CUDA_VISIBLE_DEVICES=0 timeout 200 \
        python3 -m benchmarks.kernels_kda --t 1 6 --out "$OUT/k_$1" 2>&1 | stamp > "$OUT/kda_$1.log"
    echo "== $1"; grep -E "\| lingc \||fla" "$OUT/kda_$1.log"
}
run_kda carried "$TRITON_CACHE_DIR"
mkdir -p /tmp/fresh_cache
run_kda fresh /tmp/fresh_cache
run_kda carried_again "$TRITON_CACHE_DIR"
run_kda fresh_again /tmp/fresh_cache
python3 - "$TRITON_CACHE_DIR" /tmp/fresh_cache "$OUT" <<'PY' 2>&1 | tee "$OUT/cubins.log"
import hashlib, json, os, sys
carried, fresh, out = sys.argv[1:4]
def entries(root, used):
    keys = set(open(used).read().split()) if os.path.exists(used) else set(os.listdir(root))
    rows = {}
    for k in sorted(keys):
        d = os.path.join(root, k)
        for f in (os.listdir(d) if os.path.isdir(d) else []):
            if f.endswith(".cubin") and "kda_chain" in f:
                meta = json.load(open(os.path.join(d, f[:-6] + ".json")))
                b = open(os.path.join(d, f), "rb").read()
                rows[k] = (hashlib.md5(b).hexdigest()[:12], len(b), meta.get("n_regs"), meta.get("shared"), meta.get("num_warps"))
    return rows
a = entries(carried, os.path.join(out, "used_carried.txt"))
b = entries(fresh, os.path.join(out, "used_fresh.txt"))
for k in sorted(set(a) | set(b)):
    print(k[:16], "carried", a.get(k), "fresh", b.get(k), "SAME" if a.get(k) == b.get(k) else "DIFFER")
PY
for n in carried fresh carried_again fresh_again; do cat "$OUT/kda_$n.log" >> "$OUT/kda_all.log"; rm -f "$OUT/kda_$n.log"; done
cp "$OUT/k_carried/kernels_kda.json" "$OUT/kda_carried.json"; cp "$OUT/k_fresh/kernels_kda.json" "$OUT/kda_fresh.json"
rm -rf "$OUT"/k_* "$OUT"/used_*.txt
grep -qiE "error" "$OUT/install.log" || rm -f "$OUT/install.log"
find "$OUT" -maxdepth 1 -empty -delete; ls -la "$OUT"
