"""A decode_as PRELUDE (device_env.sh): point the GEMM launch table at a sweep's results.

For each shape in the gemm_sweep JSON named by $SWEEP_JSON, take the fastest config over the
swept M values (``gemm_sweep.table_entry``) among those whose name starts with $SWEEP_DESIGN
("A", "B", "C"; empty: any design) and put it in the launch table, so one decode run measures
what the sweep's winners do inside the real PDL chain. Prints what it changed.
"""
import json
import os

import lingc.runtime.kernels.gemm.config as _cfg
from benchmarks.gemm_sweep import table_entry


def _apply(path, design):
    rows = [{**r, "cfg": _cfg.GemmConfig(**r["cfg"])} for r in json.load(open(path))["rows"]
            if r["config"].startswith(design) and "argmax" not in r["shape"]]
    ms = sorted({r["M"] for r in rows})
    for shape in dict.fromkeys(r["shape"] for r in rows):
        shape_rows = [r for r in rows if r["shape"] == shape]
        best = table_entry(shape_rows, ms)
        if best is not None:
            key = (shape_rows[0]["N"], shape_rows[0]["K"])
            print(f"table[{key}] {shape}: {_cfg.CONFIGS.get(key)} -> {best}")
            _cfg.CONFIGS[key] = best


_apply(os.environ["SWEEP_JSON"], os.environ.get("SWEEP_DESIGN", ""))
