"""SwiGLU GEMM micro-benchmark: lingc's fused kernel vs cuBLAS GEMM + separate activation.

    python -m benchmarks.kernels_swiglu --out benchmarks/results/swiglu

Shapes: the dense MLP (K=2560, N=1536) and the shared expert (K=2560, N=192) of Ling-3, bf16,
M in {1, 6} tokens (``--all-shapes`` adds N=6144 and N=768). Variants, all at limit 0:

- ``lingc``        torch.ops.lingc.swiglu_gemm's kernel, PDL-launched where supported
- ``lingc-no-pdl`` the same kernel launched without PDL
- ``eager``        ``F.silu(x @ Wg.T) * (x @ Wu.T)``: two GEMMs, silu, mul (4 kernels)
- ``fused-linear`` ``F.linear(x, W_gate_up).chunk(2, -1)`` then ``silu(g) * u`` (3 kernels)

Conditions: cold weights (each call in a graph reads a different weight copy, the copies together
span L2 several times), each call timed inside a CUDA graph of many calls with CUDA events,
median over replays; copy bandwidth measured in the same run as the floor. Correctness is checked
first (every variant against the fp32 reference); if one fails, no speedup is printed.
Reported: us per call, weight bandwidth (weight bytes / time), its fraction of copy bandwidth,
and lingc's speedup over both cuBLAS paths.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (cold_copies, copy_bandwidth_gbps, markdown_table, rel_rms, require_cuda,
                             time_in_graph, write_json)
from lingc.runtime.kernels.swiglu_gemm import interleave_gate_up, swiglu_gemm_reference
from lingc.runtime.kernels.swiglu_gemm.kernel import config_for, swiglu_gemm_triton

SHAPES = {"dense-mlp": (2560, 1536), "shared-expert": (2560, 192)}
EXTRA_SHAPES = {"n6144": (2560, 6144), "n768": (2560, 768)}
# Relative-RMS gates of the correctness check. lingc rounds once from fp32 (as in
# tests/test_swiglu_gemm.py); the cuBLAS paths round g, u, silu(g) and the product to bf16.
RTOL_RMS = {"lingc": 4e-3, "lingc-no-pdl": 4e-3, "eager": 1e-2, "fused-linear": 1e-2}


def _variants():
    """name -> fn(x, weight_set); a weight set is (gate, up, w13, w_gate_up) of one copy."""
    return {
        "lingc": lambda x, w: swiglu_gemm_triton(x, w[2][0::2], w[2][1::2], 0.0),
        "lingc-no-pdl": lambda x, w: swiglu_gemm_triton(x, w[2][0::2], w[2][1::2], 0.0, use_pdl=False),
        "eager": lambda x, w: F.silu(x @ w[0].T) * (x @ w[1].T),
        "fused-linear": lambda x, w: _silu_mul(F.linear(x, w[3])),
    }


def _silu_mul(gate_up):
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def _weight_sets(k, n, copies, gen):
    sets = []
    for _ in range(copies):
        gate = (torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(torch.bfloat16)
        up = (torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(torch.bfloat16)
        sets.append((gate, up, interleave_gate_up(gate, up), torch.cat([gate, up])))
    return sets


def bench_shape(name, k, n, ms, copy_gbps, replays):
    weight_bytes = 2 * n * k * 2  # gate + up, bf16
    copies = cold_copies(weight_bytes)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = _weight_sets(k, n, copies, gen)
    rows = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        ref = swiglu_gemm_reference(x, sets[0][2], 0.0)
        timings = {}
        for variant, fn in _variants().items():
            err = rel_rms(fn(x, sets[0]), ref)
            t = time_in_graph(fn, [(x, w) for w in sets], replays=replays)
            timings[variant] = t.us_per_call
            rows.append({
                "shape": name, "K": k, "N": n, "M": m, "variant": variant, "copies": copies,
                "us": t.us_per_call, "us_min": t.us_per_call_min, "calls_per_graph": t.calls_per_graph,
                "weight_gbps": weight_bytes / (t.us_per_call * 1e-6) / 1e9,
                "copy_fraction": weight_bytes / (t.us_per_call * 1e-6) / 1e9 / copy_gbps,
                "rel_rms_err": err, "correct": err <= RTOL_RMS[variant],
            })
        for row in rows[-len(timings):]:
            if row["variant"].startswith("lingc"):
                row["speedup_vs_eager"] = timings["eager"] / row["us"]
                row["speedup_vs_fused_linear"] = timings["fused-linear"] / row["us"]
    del sets
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_swiglu.json")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 6], help="token counts (default 1 6)")
    parser.add_argument("--all-shapes", action="store_true", help="also N=6144 and N=768")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    args = parser.parse_args(argv)
    require_cuda()

    copy_gbps = copy_bandwidth_gbps()
    shapes = {**SHAPES, **(EXTRA_SHAPES if args.all_shapes else {})}
    rows = []
    for name, (k, n) in shapes.items():
        rows += bench_shape(name, k, n, args.m, copy_gbps, args.replays)

    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        for r in rows:
            r.pop("speedup_vs_eager", None)
            r.pop("speedup_vs_fused_linear", None)
        bad = [
            f"{r['shape']} M={r['M']} {r['variant']} (rel RMS {r['rel_rms_err']:.2e})" for r in rows if not r["correct"]
        ]
        print("CORRECTNESS CHECK FAILED, speedups withheld: " + "; ".join(bad))
    print(f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s\n")
    print(markdown_table(rows, [
        ("shape", "shape", "s"), ("M", "M", "d"), ("variant", "variant", "s"), ("us", "us/call", ".2f"),
        ("weight_gbps", "weight GB/s", ".0f"), ("copy_fraction", "of copy BW", ".0%"),
        ("speedup_vs_eager", "x vs eager", ".2f"), ("speedup_vs_fused_linear", "x vs fused-linear", ".2f"),
        ("rel_rms_err", "rel RMS err", ".1e"),
    ]))
    configs = {f"{n}x{k}": config_for(n, k) for k, n in shapes.values()}
    path = write_json(args.out / "kernels_swiglu.json", {
        "benchmark": "kernels_swiglu", "dtype": "bfloat16", "limit": 0.0, "copy_gbps": copy_gbps,
        "rtol_rms": RTOL_RMS, "all_correct": all_correct, "configs": configs, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
