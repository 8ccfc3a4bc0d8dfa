"""A decode_as PRELUDE (device_env.sh): point the GEMM launch table at a sweep's results.

For each shape in the gemm_sweep JSON named by $SWEEP_JSON, take the fastest config over the
swept M values (least total time) among those whose name starts with $SWEEP_DESIGN ("A", "B",
"C"; empty: any design) and put it in the launch table, so one decode run measures what the
sweep's winners do inside the real PDL chain. Prints what it changed.
"""
import json
import os
import re

import lingc.runtime.kernels.gemm.config as _cfg


def _parse(name):
    m = re.fullmatch(r"C rows(\d+) w(\d+)( ahead)?", name)
    if m:
        return _cfg._c(int(m[1]), int(m[2]), 2 if m[3] else 1)
    m = re.fullmatch(r"B bn(\d+) sk(\d+) w(\d+)", name)
    if m:
        return _cfg._b(int(m[1]), int(m[2]), int(m[3]))
    m = re.fullmatch(r"A bn(\d+) sk(\d+) bk(\d+) st(\d+) w(\d+)", name)
    return _cfg._a(int(m[1]), int(m[2]), int(m[3]), int(m[5]), int(m[4]))


def _apply(path, design):
    rows = json.load(open(path))["rows"]
    ms = {r["M"] for r in rows}
    totals = {}
    for r in rows:
        if r.get("us") is not None and r["config"].startswith(design) and "argmax" not in r["shape"]:
            totals.setdefault((r["N"], r["K"], r["shape"]), {}).setdefault(r["config"], {})[r["M"]] = r["us"]
    for (n, k, shape), per in totals.items():
        full = {c: sum(t.values()) for c, t in per.items() if set(t) == ms}
        if full:
            best = min(full, key=full.get)
            print(f"table[{(n, k)}] {shape}: {_cfg.CONFIGS.get((n, k))} -> {best} ({full[best]:.2f} us over M)")
            _cfg.CONFIGS[(n, k)] = _parse(best)


_apply(os.environ["SWEEP_JSON"], os.environ.get("SWEEP_DESIGN", ""))
