"""Run every kernel micro-benchmark into one output folder (method.md: cold weights, CUDA graphs,
medians, the copy-bandwidth floor in the same run).

    python -m benchmarks.kernels --out OUT [--only swiglu,gemm,kda,gdn,moe,qwen3_moe,attn,sampling] [--inductor]
    python -m benchmarks.kernels --out OUT --smoke     # CPU: the benchmarks with a smoke mode

Each benchmark writes its own JSON and prints its markdown table; this runner runs them in one
process, keeps going when one fails (and says which), and writes OUT/kernels_summary.json with
each one's status and wall time, and, where matplotlib is installed, OUT/kernels.png
(``benchmarks.plot_kernels``: lingc beside each baseline and the floor, per kernel).
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
import traceback
from pathlib import Path

from .common import write_json

BENCHES = {
    "swiglu": ("kernels_swiglu", ["--all-shapes"]),
    "gemm": ("kernels_gemm", []),
    "kda": ("kernels_kda", []),
    "gdn": ("kernels_gdn", []),
    "moe": ("kernels_moe", []),
    "qwen3_moe": ("kernels_qwen3_moe", []),
    "attn": ("kernels_attn", []),
    "sampling": ("kernels_sampling", []),
}
NO_INDUCTOR = {"gemm": [], "moe": ["--inductor"], "attn": ["--no-inductor"]}
# Benchmarks with a CPU smoke mode (tiny preset, kernels under the Triton interpreter, wall-clock
# timing) and its arguments; the others time CUDA graphs and need a GPU.
SMOKE = {"moe": ["--smoke"], "qwen3_moe": ["--smoke"]}
WITH_INDUCTOR = {"gemm": ["--inductor"], "kda": ["--inductor"], "sampling": ["--inductor"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--inductor", action="store_true",
                    help="include the torch.compile columns (slow: Inductor compiles each shape)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"CPU smoke run of the benchmarks that have one ({sorted(SMOKE)}); the others are "
                         f"listed as GPU-only")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; valid: {sorted(BENCHES)}")
    if args.smoke:
        # Before any kernel module is imported: triton.jit decides at decoration time.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    summary = {}
    for name in names:
        module, extra = BENCHES[name]
        if args.smoke and name not in SMOKE:
            summary[name] = {"status": "GPU only: no CPU smoke mode", "seconds": 0.0}
            write_json(args.out / "kernels_summary.json", summary)
            continue
        extra = SMOKE[name] if args.smoke else \
            extra + (WITH_INDUCTOR.get(name, []) if args.inductor else NO_INDUCTOR.get(name, []))
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
    _plot(args.out)
    return 0 if all(s["status"] == "ok" or s["status"].startswith("GPU only") for s in summary.values()) else 1


def _plot(out: Path) -> None:
    """OUT/kernels.png from the JSON written (benchmarks.plot_kernels), where matplotlib is."""
    from . import plot_kernels
    try:
        print(f"wrote {plot_kernels.draw(plot_kernels.load([out]), out / 'kernels.png')}")
    except ImportError:         # draw's matplotlib
        print(f"no matplotlib here: python -m benchmarks.plot_kernels {out} --out kernels.png draws the chart "
              f"on any machine that has it")
    except SystemExit as e:     # nothing to draw (every benchmark failed): the summary says why
        print(f"no chart: {e}")


if __name__ == "__main__":
    raise SystemExit(main())
