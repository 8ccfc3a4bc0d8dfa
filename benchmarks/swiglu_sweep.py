"""Sweep launch configurations of the SwiGLU GEMM on the GPU, to fill the fixed table in
runtime/kernels/swiglu_gemm/kernel.py (autotuning happens here, never on the captured path).

    python -m benchmarks.swiglu_sweep --out benchmarks/results

Design A: K-loop with a software pipeline (first tile before gdc_wait), split-K reduced by a
second kernel. Design B (`prefetch=True`): each CTA's whole weight chunk (2*block_n rows x
K/split_k) is loaded before gdc_wait, split-K reduced in the same launch. Each candidate is
checked against the reference first, then timed as in kernels_swiglu (cold weights, CUDA graph
of many calls, PDL on); the best per (N, M) is marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import cold_copies, copy_bandwidth_gbps, markdown_table, time_in_graph, write_json
from lingc.runtime.kernels.swiglu_gemm.kernel import SwigluGemmConfig as C
from lingc.runtime.kernels.swiglu_gemm.kernel import config_for, swiglu_gemm_triton
from lingc.runtime.kernels.swiglu_gemm.naive import swiglu_gemm_reference_separate

K = 2560
CANDIDATES = {
    1536: [C(16, 0, 5, prefetch=True), C(32, 0, 10, prefetch=True), C(16, 0, 10, prefetch=True),
           C(8, 0, 5, prefetch=True), C(16, 0, 5, num_warps=8, prefetch=True),
           C(32, 0, 5, num_warps=8, prefetch=True), C(8, 0, 10, prefetch=True)],
    192: [C(16, 0, 10, prefetch=True), C(8, 0, 10, prefetch=True), C(16, 0, 20, prefetch=True),
          C(8, 0, 20, prefetch=True), C(8, 0, 5, prefetch=True), C(16, 0, 5, prefetch=True)],
    768: [C(16, 0, 5, prefetch=True), C(16, 0, 10, prefetch=True), C(8, 0, 5, prefetch=True),
          C(32, 0, 10, prefetch=True)],
    6144: [C(16, 0, 5, prefetch=True), C(32, 0, 5, num_warps=8, prefetch=True),
           C(32, 0, 10, prefetch=True), C(16, 0, 2, num_warps=8, prefetch=True)],
}


def _name(c: C) -> str:
    d = "B" if c.prefetch else "A"
    kk = f"-bk{c.block_k}-st{c.num_stages}" if not c.prefetch else ""
    return f"{d} bn{c.block_n} sk{c.split_k}{kk} w{c.num_warps}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, nargs="+", default=sorted(CANDIDATES))
    ap.add_argument("--m", type=int, nargs="+", default=[1, 6])
    args = ap.parse_args(argv)
    copy = copy_bandwidth_gbps()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for n in args.n:
        wbytes = 2 * n * K * 2
        sets = [((torch.randn(n, K, generator=gen, device="cuda") / K**0.5).bfloat16(),
                 (torch.randn(n, K, generator=gen, device="cuda") / K**0.5).bfloat16())
                for _ in range(cold_copies(wbytes))]
        for m in args.m:
            x = torch.randn(m, K, generator=gen, device="cuda").bfloat16()
            ref = swiglu_gemm_reference_separate(x, *sets[0], 0.0)
            best = None
            for cfg in [config_for(n, K)] + CANDIDATES[n]:
                fn = (lambda c: lambda x, g, u: swiglu_gemm_triton(x, g, u, 0.0, config=c))(cfg)
                err = ((fn(x, *sets[0]).double() - ref.double()).norm() / ref.double().norm()).item()
                row = {"N": n, "M": m, "config": _name(cfg), "rel_err": err}
                if err > 4e-3:
                    row["us"] = None
                else:
                    t = time_in_graph(fn, [(x, g, u) for g, u in sets], replays=20)
                    row.update(us=t.us_per_call, frac=wbytes / (t.us_per_call * 1e-6) / 1e9 / copy)
                    if best is None or t.us_per_call < best["us"]:
                        best = row
                rows.append(row)
            if best is not None:
                best["best"] = "*"
        del sets
        torch.cuda.empty_cache()
    print(f"copy bandwidth {copy:.0f} GB/s")
    print(markdown_table(rows, [("N", "N", "d"), ("M", "M", "d"), ("config", "config", "s"),
                                ("us", "us/call", ".2f"), ("frac", "of copy BW", ".0%"),
                                ("rel_err", "rel err", ".1e"), ("best", "best", "s")]))
    write_json(args.out / "swiglu_sweep.json", {"copy_gbps": copy, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
