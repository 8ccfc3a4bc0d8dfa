"""Run every kernel micro-benchmark into one output folder (method.md: cold weights, CUDA graphs,
medians, the copy-bandwidth floor in the same run).

    python -m benchmarks.kernels --out OUT [--only swiglu,gemm,kda,moe,attn] [--inductor]

Each benchmark writes its own JSON and prints its markdown table; this runner runs them in one
process, keeps going when one fails (and says which), and writes OUT/kernels_summary.json with
each one's status and wall time.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback
from pathlib import Path

from .common import write_json

BENCHES = {
    "swiglu": ("kernels_swiglu", ["--all-shapes"]),
    "gemm": ("kernels_gemm", []),
    "kda": ("kernels_kda", []),
    "moe": ("kernels_moe", []),
    "attn": ("kernels_attn", []),
}
NO_INDUCTOR = {"gemm": [], "moe": ["--inductor"], "attn": ["--no-inductor"]}
WITH_INDUCTOR = {"gemm": ["--inductor"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--inductor", action="store_true",
                    help="include the torch.compile columns (slow: Inductor compiles each shape)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; valid: {sorted(BENCHES)}")
    summary = {}
    for name in names:
        module, extra = BENCHES[name]
        extra = extra + (WITH_INDUCTOR.get(name, []) if args.inductor else NO_INDUCTOR.get(name, []))
        print(f"\n=== {name}: python -m benchmarks.{module} --out {args.out} {' '.join(extra)}", flush=True)
        t0 = time.perf_counter()
        try:
            rc = importlib.import_module(f"benchmarks.{module}").main(["--out", str(args.out)] + extra)
            status = "ok" if not rc else f"exit {rc} (a correctness check failed: see its table)"
        except Exception as e:  # noqa: BLE001  (report and go on with the others)
            traceback.print_exc()
            status = f"error: {type(e).__name__}: {e}"
        summary[name] = {"status": status, "seconds": time.perf_counter() - t0}
        write_json(args.out / "kernels_summary.json", summary)
    for name, s in summary.items():
        print(f"{name:<8} {s['status']}  ({s['seconds']:.0f} s)")
    return 0 if all(s["status"] == "ok" for s in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
