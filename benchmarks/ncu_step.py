"""One captured lingc step of flash-tp4-rank under Nsight Compute: each kernel's own time and DRAM bytes.

    python -m benchmarks.ncu_step --ncu-command --out OUT     # prints the ncu command line to run:
    ncu --profile-from-start off --graph-profiling node --clock-control none --csv --page raw \\
        --print-units base --metrics METRICS --log-file OUT/ncu.csv \\
        python3 -m benchmarks.ncu_step --roles decode verify --out OUT
    python -m benchmarks.ncu_step --summarize OUT/ncu.csv --out OUT   # the table by kernel name

The first form compiles and captures the steps of `--roles` (as the decode benchmark does, from
the same synthetic context) and replays each step's graph once between cudaProfilerStart and
cudaProfilerStop; ncu profiles every kernel node of those replays. It writes OUT/ncu_roles.json:
the roles in replay order with their kernel-node counts, so the summary can tell them apart.

Under ncu each kernel runs alone, with the caches flushed before it: its time is the kernel's own
cost with nothing overlapping it (no PDL). So the sum over a step, against the step's graph time,
says how much the chain itself costs (launch gaps, PDL waits) and how much the kernels; and each
kernel's DRAM bytes over its time says how far it is from the copy bandwidth.
"""
from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import torch

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "launch__registers_per_thread", "launch__grid_size", "launch__block_size",
           "sm__warps_active.avg.pct_of_peak_sustained_active")


def ncu_command(roles: list[str], out: Path, ncu: str = "ncu") -> str:
    """The Nsight Compute command line that profiles `run` (METRICS, base units, CSV)."""
    return (f"{ncu} --profile-from-start off --graph-profiling node --clock-control none --csv --page raw "
            f"--print-units base --metrics {','.join(METRICS)} --log-file {out / 'ncu.csv'} "
            f"python3 -m benchmarks.ncu_step --roles {' '.join(roles)} --out {out}")


def run(roles: list[str], context: int, out: Path) -> None:
    from lingc.models import build_model, preset
    from lingc.runtime.relay.engine import Engine
    from lingc.runtime.relay.graphs import describe

    from .decode import synthetic_start

    model = build_model(preset("flash-tp4-rank", router_dtype="bf16"), device="cuda", dtype=torch.bfloat16,
                        seed=0, progress=True)
    eng = Engine(model, max_len=context + 512, options={"inductor": False}, progress=True)
    eng.prepare(roles)
    synthetic_start(eng, context)
    order = []
    with torch.no_grad():
        for role in roles:
            eng._steps[role]()                      # warm: the graph's first replay
            torch.cuda.synchronize()
        cudart = torch.cuda.cudart()
        cudart.cudaProfilerStart()
        for role in roles:
            eng._steps[role]()
            torch.cuda.synchronize()
        cudart.cudaProfilerStop()
    for role in roles:
        info = describe(eng._steps[role])
        if info is None:
            raise SystemExit(f"the {role} step was not captured ({eng._steps[role].reason}): nothing to profile")
        order.append({"role": role, "kernels": info.kernel_nodes, "graph": info.format()})
    (out / "ncu_roles.json").write_text(json.dumps(order, indent=1))
    print(json.dumps(order, indent=1))


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return float("nan")


def read_ncu_csv(path: Path) -> list[dict]:
    """The kernel rows of `ncu --csv --page raw` (a units row follows the header; ncu's own
    messages before the header are skipped)."""
    lines = path.read_text(errors="replace").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    units = rows[0] if rows and not rows[0].get("ID", "").strip() else {}
    scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
             "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
    kernels = [r for r in rows if r.get("ID", "").strip().isdigit()]
    for r in kernels:              # to base units (ns, bytes), whatever ncu printed
        for k, u in units.items():
            if u in scale and scale[u] != 1.0:
                r[k] = str(_num(r[k]) * scale[u])
    return kernels


def summarize(path: Path, out: Path) -> dict:
    rows = read_ncu_csv(path)
    roles_file = path.parent / "ncu_roles.json"
    order = json.loads(roles_file.read_text()) if roles_file.exists() else [{"role": "all", "kernels": len(rows)}]
    result, i = {}, 0
    for o in order:
        n = o["kernels"] or len(rows) - i
        part = rows[i:i + n]
        i += n
        by = defaultdict(lambda: {"calls": 0, "us": 0.0, "read_mb": 0.0, "write_mb": 0.0, "regs": 0, "grid": 0,
                                  "occupancy_pct": 0.0})
        for r in part:
            name = r.get("Kernel Name", "?")[:60]
            d = by[name]
            d["calls"] += 1
            d["us"] += _num(r.get("gpu__time_duration.sum", "nan")) / 1e3     # ns -> us
            d["read_mb"] += _num(r.get("dram__bytes_read.sum", "nan")) / 1e6
            d["write_mb"] += _num(r.get("dram__bytes_write.sum", "nan")) / 1e6
            d["regs"] = int(_num(r.get("launch__registers_per_thread", "0")))
            d["grid"] = max(d["grid"], int(_num(r.get("launch__grid_size", "0"))))
            d["occupancy_pct"] += _num(r.get("sm__warps_active.avg.pct_of_peak_sustained_active", "nan"))
        table = []
        for name, d in sorted(by.items(), key=lambda kv: -kv[1]["us"]):
            d["occupancy_pct"] /= d["calls"]
            d["tbps"] = (d["read_mb"] + d["write_mb"]) / d["us"] if d["us"] else 0.0   # MB per us = TB/s
            table.append({"kernel": name, **d})
        total = sum(d["us"] for d in by.values())
        result[o["role"]] = {"kernels": len(part), "isolated_us_total": total, "by_kernel": table}
        print(f"\n{o['role']}: {len(part)} kernels, sum of isolated times {total:.1f} us")
        print("| kernel | calls | us total | us/call | DRAM read MB | TB/s | regs | max grid | warps active % |")
        print("|---|---|---|---|---|---|---|---|---|")
        for t in table:
            print(f"| {t['kernel']} | {t['calls']} | {t['us']:.1f} | {t['us'] / t['calls']:.2f} | {t['read_mb']:.1f} | "
                  f"{t['tbps']:.2f} | {t['regs']} | {t['grid']} | {t['occupancy_pct']:.0f} |")
    (out / "ncu_summary.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--roles", nargs="+", default=["decode", "verify"])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--out", default="ncu_out")
    ap.add_argument("--summarize", help="an ncu --csv --page raw log to summarise instead of running")
    ap.add_argument("--ncu-command", action="store_true", help="print the ncu command line that profiles a run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.ncu_command:
        print(ncu_command(args.roles, out))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        summarize(Path(args.summarize), out)
    else:
        run(args.roles, args.context, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
