"""Decode GEMM micro-benchmark: lingc's projection GEMM and lm_head GEMM + argmax vs cuBLAS.

    python -m benchmarks.kernels_gemm --out benchmarks/results [--preset flash-tp4-rank]

Shapes: every projection of the preset (``SHAPES``), bf16, M in {1, 6} tokens; same-input groups
both one by one and fused (KDA q/k/v/f/g/b, MLA q_proj/kv_a/g_proj); the lm_head as greedy
decode uses it. Variants:

- ``lingc``        torch.ops.lingc.gemm's launcher, PDL-launched where supported; a fused group
                   is ONE launch over the list of weights, read in place
- ``lingc-no-pdl`` the same launch without PDL
- ``cublas``       ``F.linear`` per weight (a fused group: one cuBLAS call per weight)
- ``cublas-cat``   fused groups only: ``F.linear`` over a pre-concatenated weight (what a
                   framework gets by re-laying the weights once)
- lm_head: ``lingc-argmax`` (gemm_argmax: ids and max logit, no logit row written) vs
  ``cublas+argmax`` (``F.linear`` then ``torch.argmax``)

Conditions (benchmarks/common.py): cold weights (each call in a graph reads a different weight
copy; the copies together span L2 several times), each call inside a CUDA graph of many calls
timed with CUDA events, median over replays; copy bandwidth measured in the same run. Correctness
is checked first (every variant against the fp32 reference); if one fails, no speedup is printed
and the exit status is 1. Reported: us per call, weight bandwidth (weight bytes / time), its
fraction of copy bandwidth, lingc's speedup over cuBLAS, and the targets (fused projections
>= 80% of copy bandwidth at M=1 and >= 75% at M=6, lm_head argmax >= 85%).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (cold_copies, copy_bandwidth_gbps, markdown_table, rel_rms, require_cuda,
                             time_in_graph, write_json)
from lingc.runtime.kernels.gemm import gemm_reference
from lingc.runtime.kernels.gemm.argmax_kernel import gemm_argmax_triton
from lingc.runtime.kernels.gemm.config import argmax_config_for, config_for
from lingc.runtime.kernels.gemm.kernel import gemm_triton

# name -> (K, weight rows). "fused" groups are one lingc launch over the list of weights.
SHAPES = {
    "flash-tp4-rank": {
        "KDA q/k/v/f/g (one)": (2560, (1024,)),
        "KDA b": (2560, (8,)),
        "KDA fused q/k/v/f/g/b": (2560, (1024,) * 5 + (8,)),
        "KDA o_proj / MLA dense": (1024, (2560,)),
        "MLA q_proj": (2560, (1536,)),
        "MLA kv_a": (2560, (576,)),
        "MLA g_proj": (2560, (8,)),
        "MLA fused q/kv_a/g": (2560, (1536, 576, 8)),
        "MLP down": (1536, (2560,)),
        "shared expert down": (192, (2560,)),
        "NEXTN eh_proj": (5120, (2560,)),
    },
    "flash": {
        "KDA q/k/v/f/g (one)": (2560, (4096,)),
        "KDA b": (2560, (32,)),
        "KDA fused q/k/v/f/g/b": (2560, (4096,) * 5 + (32,)),
        "o_proj / MLA dense": (4096, (2560,)),
        "MLA q_proj": (2560, (6144,)),
        "MLA kv_a": (2560, (576,)),
        "MLA fused q/kv_a/g": (2560, (6144, 576, 32)),
        "MLP down": (6144, (2560,)),
        "shared expert down": (768, (2560,)),
    },
}
LM_HEAD = {"flash-tp4-rank": (2560, 39296), "flash": (2560, 157184)}
TARGETS = {("fused", 1): 0.80, ("fused", 6): 0.75, ("lm_head", 1): 0.85, ("lm_head", 6): 0.85}
RTOL_RMS = 4e-3  # every variant rounds once from fp32 sums (tests/test_gemm.py)


def _weight_sets(k, rows, copies, gen, with_cat):
    """``copies`` independent weight lists (plus their concatenation for cublas-cat)."""
    sets = []
    for _ in range(copies):
        ws = [(torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(torch.bfloat16) for n in rows]
        sets.append((ws, torch.cat(ws) if with_cat else None))
    return sets


def _linears(x, ws):
    return [F.linear(x, w) for w in ws]


def _variants(fused: bool, inductor: bool = False):
    v = {
        "lingc": lambda x, s: gemm_triton(x, s[0]),
        "lingc-no-pdl": lambda x, s: gemm_triton(x, s[0], use_pdl=False),
        "cublas": lambda x, s: _linears(x, s[0]),
    }
    if fused:
        v["cublas-cat"] = lambda x, s: F.linear(x, s[1])
    if inductor:
        # torch.compile's default Inductor (its own CUDA graphs off: the benchmark captures);
        # compiled during time_in_graph's eager warm-up, before the capture. Dynamo caches the
        # compiled graphs on _linears' code object, and past its recompile limit (8) a new shape
        # would run eagerly without a word: this run's 11 shapes x 2 M start from a clean cache.
        torch._dynamo.reset()
        compiled = torch.compile(_linears, dynamic=False)
        v["inductor"] = lambda x, s: compiled(x, s[0])
    return v


def _row(kind, name, k, rows, m, variant, t, wbytes, copy_gbps, err, correct, copies):
    gbps = wbytes / (t.us_per_call * 1e-6) / 1e9
    return {
        "kind": kind, "shape": name, "K": k, "N": sum(rows), "weights": len(rows), "M": m, "variant": variant,
        "copies": copies, "us": t.us_per_call, "us_min": t.us_per_call_min, "weight_gbps": gbps,
        "copy_fraction": gbps / copy_gbps, "rel_rms_err": err, "correct": correct,
    }


def bench_projection(name, k, rows, ms, copy_gbps, replays, inductor=False):
    fused = len(rows) > 1
    wbytes = sum(rows) * k * 2
    copies = cold_copies(wbytes * (2 if fused else 1))
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = _weight_sets(k, rows, copies, gen, fused)
    kind = "fused" if fused else "single"
    out = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        ref = gemm_reference(x, sets[0][0])
        timed = {}
        for variant, fn in _variants(fused, inductor).items():
            y = fn(x, sets[0])
            err = rel_rms(torch.cat(y, dim=1) if isinstance(y, list) else y, ref)
            t = time_in_graph(fn, [(x, s) for s in sets], replays=replays)
            timed[variant] = t.us_per_call
            out.append(_row(kind, name, k, rows, m, variant, t, wbytes, copy_gbps, err, err <= RTOL_RMS, copies))
        for row in out[-len(timed):]:
            if row["variant"].startswith("lingc"):
                row["speedup_vs_cublas"] = timed["cublas"] / row["us"]
                if fused:
                    row["speedup_vs_cublas_cat"] = timed["cublas-cat"] / row["us"]
    del sets
    torch.cuda.empty_cache()
    return out


def _argmax_ok(ids, x, w):
    """ids pick a maximum of the reference logits up to one bf16 rounding of the largest."""
    ref = gemm_reference(x, [w]).float()
    picked = ref.gather(1, ids[:, None].long())[:, 0]
    return bool(torch.all(picked >= ref.max(dim=1).values - 2 * 2.0**-7 * ref.abs().max()))


def bench_lm_head(k, n, ms, copy_gbps, replays):
    wbytes = n * k * 2
    copies = cold_copies(wbytes)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ws = [(torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(torch.bfloat16) for _ in range(copies)]
    variants = {
        "lingc-argmax": lambda x, w: gemm_argmax_triton(x, w)[0],
        "lingc-argmax-no-pdl": lambda x, w: gemm_argmax_triton(x, w, use_pdl=False)[0],
        "cublas+argmax": lambda x, w: torch.argmax(F.linear(x, w), dim=-1),
    }
    out = []
    for m in ms:
        x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        timed = {}
        for variant, fn in variants.items():
            ok = _argmax_ok(fn(x, ws[0]), x, ws[0])
            t = time_in_graph(fn, [(x, w) for w in ws], replays=replays)
            timed[variant] = t.us_per_call
            out.append(_row("lm_head", "lm_head argmax", k, (n,), m, variant, t, wbytes, copy_gbps, None, ok, copies))
        for row in out[-len(timed):]:
            if row["variant"].startswith("lingc"):
                row["speedup_vs_cublas"] = timed["cublas+argmax"] / row["us"]
    del ws
    torch.cuda.empty_cache()
    return out


def _targets(rows):
    """One line per target: the lingc rows it applies to and whether each meets it."""
    lines = []
    for (kind, m), goal in TARGETS.items():
        variant = "lingc-argmax" if kind == "lm_head" else "lingc"
        hits = [r for r in rows if r["kind"] == kind and r["M"] == m and r["variant"] == variant]
        for r in hits:
            verdict = "met" if r["copy_fraction"] >= goal else "MISSED"
            frac = r["copy_fraction"]
            lines.append(f"- {r['shape']} M={m}: {frac:.0%} of copy bandwidth (target {goal:.0%}): {verdict}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for kernels_gemm_<preset>.json")
    parser.add_argument("--preset", choices=sorted(SHAPES), default="flash-tp4-rank")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 6], help="token counts (default 1 6)")
    parser.add_argument("--replays", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--no-lm-head", action="store_true", help="skip the lm_head argmax")
    parser.add_argument("--inductor", action="store_true",
                        help="add torch.compile (Inductor, default mode) of the same linears")
    args = parser.parse_args(argv)
    require_cuda()

    copy_gbps = copy_bandwidth_gbps()
    rows = []
    for name, (k, wrows) in SHAPES[args.preset].items():
        rows += bench_projection(name, k, wrows, args.m, copy_gbps, args.replays, args.inductor)
    if not args.no_lm_head:
        rows += bench_lm_head(*LM_HEAD[args.preset], args.m, copy_gbps, args.replays)

    all_correct = all(r["correct"] for r in rows)
    if not all_correct:
        for r in rows:
            r.pop("speedup_vs_cublas", None)
            r.pop("speedup_vs_cublas_cat", None)
        bad = [f"{r['shape']} M={r['M']} {r['variant']} (rel RMS {r['rel_rms_err']})" for r in rows if not r["correct"]]
        print("CORRECTNESS CHECK FAILED, speedups withheld: " + "; ".join(bad))
    print(f"copy bandwidth (read + write): {copy_gbps:.0f} GB/s\n")
    print(markdown_table(rows, [
        ("shape", "shape", "s"), ("N", "N", "d"), ("K", "K", "d"), ("M", "M", "d"), ("variant", "variant", "s"),
        ("us", "us/call", ".2f"), ("weight_gbps", "weight GB/s", ".0f"), ("copy_fraction", "of copy BW", ".0%"),
        ("speedup_vs_cublas", "x vs cuBLAS", ".2f"), ("speedup_vs_cublas_cat", "x vs cuBLAS cat", ".2f"),
    ]))
    targets = _targets(rows)
    print("\ntargets:\n" + "\n".join(targets))
    shapes = list(SHAPES[args.preset].values())
    configs = {f"{sum(r)}x{k}": config_for(sum(r), k) for k, r in shapes}
    k_lm, n_lm = LM_HEAD[args.preset]
    configs[f"argmax {n_lm}x{k_lm}"] = argmax_config_for(n_lm, k_lm)
    path = write_json(args.out / f"kernels_gemm_{args.preset}.json", {
        "benchmark": "kernels_gemm", "preset": args.preset, "dtype": "bfloat16", "copy_gbps": copy_gbps,
        "rtol_rms": RTOL_RMS, "all_correct": all_correct, "configs": configs, "targets": targets, "rows": rows,
    })
    print(f"\nwrote {path}")
    return 0 if all_correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
